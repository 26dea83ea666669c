/* What level-zero-sys binds: the Level Zero core API. */
#include <level_zero/ze_api.h>
