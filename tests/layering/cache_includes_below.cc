// Compiled as a file of src/cache: every layer below it (and util) is visible.
#include "memory/backend.h"
#include "plan/plan_internal.h"
#include "prefix/prefix_index.h"
#include "storage/storage.h"
#include "util/check.h"
