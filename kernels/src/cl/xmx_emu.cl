// xmx_emu.cl — the XMX matmul of xmx.cl with its matrix built-in emulated in sub-group shuffles (entry points
// suffixed _emu): the form the CPU runtime runs in CI, so the hardware kernel's tiling and operand layouts are checked.
#define XMX_EMULATE 1
#include "xmx.cl"
