// The machine's f32 multiply-add peak, measured: the physical limit that bounds any f32
// backend's run time from below (its FLOPs over this rate), whatever library it calls.
#pragma once

namespace tp::cost {

// FLOP/s of fused multiply-adds on `threads` threads at the widest vector unit the CPU has
// (AVX-512, else AVX2+FMA, else scalar): the best of `tries` runs of about `seconds` each.
double MeasureF32Peak(int threads, double seconds = 0.02, int tries = 3);

}  // namespace tp::cost
