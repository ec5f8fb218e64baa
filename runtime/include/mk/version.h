// Version of the mk runtime ABI shared by the CPU executor and the emitted CUDA.
#pragma once

#define MK_RUNTIME_ABI 3
