#pragma once
#include "emu_api.h"
#ifdef __cplusplus
#include "emu.h"
#endif
