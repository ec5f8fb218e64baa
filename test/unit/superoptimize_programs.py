"""Unfused nn programs the superoptimizer tests search over (small shapes: each search is a few
seconds on two cores)."""

RMS_LINEAR = """
func.func @rms_linear(%x: tensor<4x128xbf16>, %g: tensor<128xbf16>, %w: tensor<256x128xbf16>) -> tensor<4x256xbf16> {
  %h = nn.rms_norm %x, %g {epsilon = 1.0e-06 : f32} : (tensor<4x128xbf16>, tensor<128xbf16>) -> tensor<4x128xbf16>
  %y = nn.linear %h, %w : (tensor<4x128xbf16>, tensor<256x128xbf16>) -> tensor<4x256xbf16>
  func.return %y : tensor<4x256xbf16>
}
"""

# RMSNorm spelled out: x·rsqrt(mean(x²) + ε)·g (ε as a tensor: nn has no scalar constants).
RMS_UNFUSED = """
func.func @rms_unfused(%x: tensor<4x128xf32>, %eps: tensor<1xf32>, %g: tensor<128xf32>, %w: tensor<256x128xf32>) -> tensor<4x256xf32> {
  %sq = nn.mul %x, %x : (tensor<4x128xf32>, tensor<4x128xf32>) -> tensor<4x128xf32>
  %ms = nn.reduce_mean %sq {dim = 1 : i64, keepdim = true} : (tensor<4x128xf32>) -> tensor<4x1xf32>
  %me = nn.add %ms, %eps : (tensor<4x1xf32>, tensor<1xf32>) -> tensor<4x1xf32>
  %r = nn.rsqrt %me : (tensor<4x1xf32>) -> tensor<4x1xf32>
  %xn = nn.mul %x, %r : (tensor<4x128xf32>, tensor<4x1xf32>) -> tensor<4x128xf32>
  %h = nn.mul %xn, %g : (tensor<4x128xf32>, tensor<128xf32>) -> tensor<4x128xf32>
  %y = nn.linear %h, %w : (tensor<4x128xf32>, tensor<256x128xf32>) -> tensor<4x256xf32>
  func.return %y : tensor<4x256xf32>
}
"""

GATED = """
func.func @gated(%x: tensor<4x128xbf16>, %wg: tensor<256x128xbf16>, %wu: tensor<256x128xbf16>) -> tensor<4x256xbf16> {
  %g = nn.linear %x, %wg : (tensor<4x128xbf16>, tensor<256x128xbf16>) -> tensor<4x256xbf16>
  %u = nn.linear %x, %wu : (tensor<4x128xbf16>, tensor<256x128xbf16>) -> tensor<4x256xbf16>
  %s = nn.silu %g : (tensor<4x256xbf16>) -> tensor<4x256xbf16>
  %m = nn.mul %s, %u : (tensor<4x256xbf16>, tensor<4x256xbf16>) -> tensor<4x256xbf16>
  func.return %m : tensor<4x256xbf16>
}
"""

LORA = """
func.func @lora(%x: tensor<4x128xbf16>, %w: tensor<128x256xbf16>, %a: tensor<128x16xbf16>, %b: tensor<16x256xbf16>) -> tensor<4x256xbf16> {
  %xw = nn.matmul %x, %w : (tensor<4x128xbf16>, tensor<128x256xbf16>) -> tensor<4x256xbf16>
  %xa = nn.matmul %x, %a : (tensor<4x128xbf16>, tensor<128x16xbf16>) -> tensor<4x16xbf16>
  %xab = nn.matmul %xa, %b : (tensor<4x16xbf16>, tensor<16x256xbf16>) -> tensor<4x256xbf16>
  %y = nn.add %xw, %xab : (tensor<4x256xbf16>, tensor<4x256xbf16>) -> tensor<4x256xbf16>
  func.return %y : tensor<4x256xbf16>
}
"""
