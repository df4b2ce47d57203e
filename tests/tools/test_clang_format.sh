#!/bin/bash
# Every C and CUDA source of the repository is formatted as the root's .clang-format says, under
# clang-format 14 (Debian bookworm's, which scripts/setup.sh installs; another major version lays
# out the same file differently, so it would report differences that are not there). Fails naming
# each file that differs, with the command that fixes it. engine/unicode_class.c is generated
# (engine/unicode_class.py) and left as its generator writes it.
# Exit 77 (skipped) only when no clang-format is installed at all.
set -u
src="${WF_SOURCE_DIR:?WF_SOURCE_DIR must name the source tree}"
cd "$src" || exit 1

cf=""
for c in clang-format-14 clang-format; do
	if command -v "$c" >/dev/null 2>&1; then
		cf=$c
		break
	fi
done
if [ -z "$cf" ]; then
	echo "SKIP: no clang-format installed (scripts/setup.sh installs Debian's clang-format 14)"
	exit 77
fi
version=$("$cf" --version)
major=$(printf '%s\n' "$version" | sed -n 's/.*clang-format version \([0-9][0-9]*\)\..*/\1/p')
if [ "$major" != 14 ]; then
	echo "FAIL: $cf is '$version'; the tree is formatted with clang-format 14 (install clang-format-14)"
	exit 1
fi

# The files: git's list where the tree is a checkout, else every source outside build trees.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	mapfile -t files < <(git ls-files -- '*.c' '*.h' '*.cu' '*.cuh')
else
	mapfile -t files < <(find . \( -name 'build*' -o -name '.git' \) -prune -o -type f \
		\( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print | sed 's|^\./||' | sort)
fi
keep=()
for f in "${files[@]}"; do
	[ "$f" = engine/unicode_class.c ] && continue
	[ -f "$f" ] && keep+=("$f")
done
if [ "${#keep[@]}" -lt 100 ]; then
	echo "FAIL: only ${#keep[@]} sources found under $src: not the weightfloor tree?"
	exit 1
fi

out=$(mktemp)
trap 'rm -f "$out"' EXIT
# xargs batches the list; --Werror makes every difference an error naming its file.
printf '%s\0' "${keep[@]}" | xargs -0 "$cf" --dry-run --Werror --style=file >"$out" 2>&1
mapfile -t bad < <(sed -n 's/^\([^ :]*\.\(c\|h\|cu\|cuh\)\):[0-9]*:[0-9]*: error: .*/\1/p' "$out" | sort -u)
if [ "${#bad[@]}" -gt 0 ]; then
	echo "FAIL: ${#bad[@]} of ${#keep[@]} files differ from .clang-format ($version):"
	printf '  %s\n' "${bad[@]}"
	echo "fix with: $cf -i --style=file ${bad[*]}"
	echo "first differences:"
	head -n 40 "$out"
	exit 1
fi
if [ -s "$out" ]; then
	echo "FAIL: $cf reported something other than formatting differences:"
	cat "$out"
	exit 1
fi
echo "ok: ${#keep[@]} files formatted as .clang-format says ($version)"
