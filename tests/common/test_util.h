#pragma once
// Helpers shared by the tests: where the golden data is, scratch directories
// (data_util.h), tensor comparisons that report what differs (tensor_compare.h).
#include "data_util.h"
#include "tensor_compare.h"
