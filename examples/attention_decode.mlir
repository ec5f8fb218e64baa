// Grouped-query decode attention: 8 query heads share 2 KV heads; keys past kv_len are masked.
func.func @attention_decode(%q: tensor<2x8x1x64xbf16>, %k: tensor<2x2x256x64xbf16>, %v: tensor<2x2x256x64xbf16>, %kv_len: tensor<2xi32>) -> tensor<2x8x1x64xbf16> {
  %o = nn.attention %q, %k, %v, %kv_len {scale = 0.125 : f32, causal = false} : (tensor<2x8x1x64xbf16>, tensor<2x2x256x64xbf16>, tensor<2x2x256x64xbf16>, tensor<2xi32>) -> tensor<2x8x1x64xbf16>
  func.return %o : tensor<2x8x1x64xbf16>
}
