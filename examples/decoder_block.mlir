// One Llama-style decoder layer for a decode step (small shapes): attention over 127 cached tokens plus the new one, then the gated MLP.
func.func @decoder_block(%x: tensor<1x256xbf16>, %attn_norm: tensor<256xbf16>, %wq: tensor<256x256xbf16>, %wk: tensor<128x256xbf16>, %wv: tensor<128x256xbf16>, %wo: tensor<256x256xbf16>, %cos: tensor<1x1x1x32xbf16>, %sin: tensor<1x1x1x32xbf16>, %k_cache: tensor<1x2x127x64xbf16>, %v_cache: tensor<1x2x127x64xbf16>, %mlp_norm: tensor<256xbf16>, %w_gate: tensor<512x256xbf16>, %w_up: tensor<512x256xbf16>, %w_down: tensor<256x512xbf16>) -> tensor<1x256xbf16> {
  %h = nn.rms_norm %x, %attn_norm {epsilon = 1.0e-05 : f32} : (tensor<1x256xbf16>, tensor<256xbf16>) -> tensor<1x256xbf16>
  %q = nn.linear %h, %wq : (tensor<1x256xbf16>, tensor<256x256xbf16>) -> tensor<1x256xbf16>
  %k = nn.linear %h, %wk : (tensor<1x256xbf16>, tensor<128x256xbf16>) -> tensor<1x128xbf16>
  %v = nn.linear %h, %wv : (tensor<1x256xbf16>, tensor<128x256xbf16>) -> tensor<1x128xbf16>
  %q4 = nn.reshape %q : (tensor<1x256xbf16>) -> tensor<1x4x1x64xbf16>
  %k4 = nn.reshape %k : (tensor<1x128xbf16>) -> tensor<1x2x1x64xbf16>
  %v4 = nn.reshape %v : (tensor<1x128xbf16>) -> tensor<1x2x1x64xbf16>
  %qr = nn.rope %q4, %cos, %sin : (tensor<1x4x1x64xbf16>, tensor<1x1x1x32xbf16>, tensor<1x1x1x32xbf16>) -> tensor<1x4x1x64xbf16>
  %kr = nn.rope %k4, %cos, %sin : (tensor<1x2x1x64xbf16>, tensor<1x1x1x32xbf16>, tensor<1x1x1x32xbf16>) -> tensor<1x2x1x64xbf16>
  %kf = nn.concat %k_cache, %kr {dim = 2 : i64} : (tensor<1x2x127x64xbf16>, tensor<1x2x1x64xbf16>) -> tensor<1x2x128x64xbf16>
  %vf = nn.concat %v_cache, %v4 {dim = 2 : i64} : (tensor<1x2x127x64xbf16>, tensor<1x2x1x64xbf16>) -> tensor<1x2x128x64xbf16>
  %att = nn.attention %qr, %kf, %vf {scale = 0.125 : f32, causal = false} : (tensor<1x4x1x64xbf16>, tensor<1x2x128x64xbf16>, tensor<1x2x128x64xbf16>) -> tensor<1x4x1x64xbf16>
  %att2 = nn.reshape %att : (tensor<1x4x1x64xbf16>) -> tensor<1x256xbf16>
  %o = nn.linear %att2, %wo : (tensor<1x256xbf16>, tensor<256x256xbf16>) -> tensor<1x256xbf16>
  %r = nn.add %x, %o : (tensor<1x256xbf16>, tensor<1x256xbf16>) -> tensor<1x256xbf16>
  %h2 = nn.rms_norm %r, %mlp_norm {epsilon = 1.0e-05 : f32} : (tensor<1x256xbf16>, tensor<256xbf16>) -> tensor<1x256xbf16>
  %g = nn.linear %h2, %w_gate : (tensor<1x256xbf16>, tensor<512x256xbf16>) -> tensor<1x512xbf16>
  %u = nn.linear %h2, %w_up : (tensor<1x256xbf16>, tensor<512x256xbf16>) -> tensor<1x512xbf16>
  %gs = nn.silu %g : (tensor<1x512xbf16>) -> tensor<1x512xbf16>
  %m = nn.mul %gs, %u : (tensor<1x512xbf16>, tensor<1x512xbf16>) -> tensor<1x512xbf16>
  %d = nn.linear %m, %w_down : (tensor<1x512xbf16>, tensor<256x512xbf16>) -> tensor<1x256xbf16>
  %y = nn.add %r, %d : (tensor<1x256xbf16>, tensor<1x256xbf16>) -> tensor<1x256xbf16>
  func.return %y : tensor<1x256xbf16>
}
