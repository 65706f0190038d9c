/* Shim: see types.h. BPF programs are built for bpfel only. */
#include <linux/byteorder/little_endian.h>
