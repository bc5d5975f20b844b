// Every epilogue node. Generated code includes this one header.
#pragma once
#include "comfuse/epilogue/core.cuh"
#include "comfuse/epilogue/ops.cuh"
#include "comfuse/epilogue/acc.cuh"
#include "comfuse/epilogue/scalar.cuh"
#include "comfuse/epilogue/row_broadcast.cuh"
#include "comfuse/epilogue/col_broadcast.cuh"
#include "comfuse/epilogue/tile_load.cuh"
#include "comfuse/epilogue/tile_load_staged.cuh"
#include "comfuse/epilogue/tile_load_ring.cuh"
#include "comfuse/epilogue/compute.cuh"
#include "comfuse/epilogue/rotate.cuh"
#include "comfuse/epilogue/store.cuh"
