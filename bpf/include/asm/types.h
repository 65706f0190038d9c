/* Shim so <linux/*.h> builds for -target bpf without an arch include dir. */
#include <asm-generic/types.h>
