/* Linked into every Criterion test of a ThreadSanitizer build (WF_SANITIZE=thread) only, so that
 * Criterion runs there at all (Snaipe/Criterion#274, open since 2018).
 *
 * Why: Criterion's sandbox (BoxFort) maps each "inheritable arena" at a random address,
 * 0x200000000000 + (rand_r() & 0x3fffff) * 16 MiB, and gives up after 10 tries. TSan reserves
 * almost all of that window for its shadow and metadata (PROT_NONE where unused; its mmap
 * interceptor refuses MAP_FIXED outside application memory), leaving one application range,
 * [0x550000000000, 0x568000000000) where PIE binaries load, about 2% of the window. So the first
 * arena usually fails ("Could not initialize inheritable arena"), and when it does not, the next
 * one, for the first test's sandbox, does, and Criterion dereferences the NULL it got back.
 *
 * What: this rand_r answers the calls that come from libcriterion with offsets inside that
 * application range (BoxFort still checks that the pages are free and asks again if not), and
 * passes every other caller to the next rand_r (TSan's interceptor, then glibc's). Nothing else of
 * Criterion changes: tests still run one process each. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* BoxFort's window (src/arena.c) and TSan's application range, as 16 MiB offsets into it. */
#define BXF_BASE  0x200000000000ull
#define BXF_STEP  (1ull << 24)
#define APP_BEGIN 0x550000000000ull
#define APP_END   0x568000000000ull
#define SLOT_LO   ((APP_BEGIN - BXF_BASE) / BXF_STEP)
#define SLOTS     ((APP_END - APP_BEGIN) / BXF_STEP)

_Static_assert(SLOT_LO + SLOTS <= 0x3fffff, "the slots fit BoxFort's mask");

static int from_criterion(const void *caller)
{
	Dl_info info;
	return dladdr(caller, &info) && info.dli_fname && strstr(info.dli_fname, "libcriterion");
}

int rand_r(unsigned int *seed)
{
	if (from_criterion(__builtin_return_address(0))) {
		*seed = *seed * 1103515245u + 12345u;
		return (int)(SLOT_LO + (*seed >> 8) % SLOTS);
	}
	/* Written once with the same value by whichever thread comes first. */
	static int (*_Atomic next)(unsigned int *);
	int (*fn)(unsigned int *) = next;
	if (!fn) {
		fn = (int (*)(unsigned int *))dlsym(RTLD_NEXT, "rand_r");
		if (!fn)
			abort();
		next = fn;
	}
	return fn(seed);
}
