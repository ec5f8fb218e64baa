// RMSNorm followed by a linear layer: the first fusion mk targets (Mirage's RMSNorm+Linear).
func.func @rmsnorm_linear(%x: tensor<8x512xbf16>, %g: tensor<512xbf16>, %w: tensor<1024x512xbf16>) -> tensor<8x1024xbf16> {
  %h = nn.rms_norm %x, %g {epsilon = 1.0e-06 : f32} : (tensor<8x512xbf16>, tensor<512xbf16>) -> tensor<8x512xbf16>
  %y = nn.linear %h, %w : (tensor<8x512xbf16>, tensor<1024x512xbf16>) -> tensor<8x1024xbf16>
  func.return %y : tensor<8x1024xbf16>
}
