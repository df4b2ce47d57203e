/* libFuzzer target: arbitrary bytes as a floor's metadata section (model/meta.h). The validating
 * walk and the building decode must agree (both accept or both refuse), and what decodes must
 * encode back to the same bytes: the encoding has one spelling per model. */
#include "base/error.h"
#include "model/meta.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int check = wf_model_meta_decode(data, size, NULL, NULL);
	uint32_t n_files = 0;
	if (size >= 12)
		memcpy(&n_files, data + 8, 4);
	if (n_files == 0 || n_files > WF_MODEL_MAX_FILES) {
		if (check == 0)
			abort(); /* the walk accepted a file count it must refuse */
		return 0;
	}
	struct wf_model m = {0};
	m.n_files = n_files;
	m.files = calloc(n_files, sizeof(*m.files));
	if (!m.files)
		return 0;
	int rc = wf_model_meta_decode(data, size, &m, NULL);
	if ((rc == 0) != (check == 0) && rc != -12 /* ENOMEM */)
		abort();
	if (rc == 0) {
		size_t len = 0;
		uint8_t *out = malloc(size ? size : 1);
		if (!out || wf_model_meta_encode(&m, out, size, &len, NULL) != 0 || len != size ||
		    memcmp(out, data, size) != 0)
			abort();
		free(out);
	} else if (m.kv.n != 0) {
		abort(); /* a refused section leaves no keys behind */
	}
	wf_kv_set_fini(&m.kv);
	free(m.files);
	return 0;
}
