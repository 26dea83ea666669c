/* What level-zero-sys binds: the Level Zero core API and the loader's own API (component versions). */
#include <level_zero/ze_api.h>
#include <level_zero/loader/ze_loader.h>
