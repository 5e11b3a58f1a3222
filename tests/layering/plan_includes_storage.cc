// Compiled as a file of src/plan (its include root, build/layers/plan): storage sits above plan,
// so this include must not be found (tests/CMakeLists.txt expects the compiler to say so).
#include "storage/storage.h"
