/* The library's version, as built: the header's macros describe the version compiled against. */
#include "tensorgrad.h"

const char *tg_version(void) { return TG_VERSION_STRING; }
