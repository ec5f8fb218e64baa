// One Llama-3-8B decoder layer for a decode step at batch 1 over a 1,024-slot KV cache (real shapes; for compile-time and GPU benchmarks): the new key and value are written in place at %pos and attention reads the first %pos + 1 slots.
func.func @llama3_8b_block(%x: tensor<1x4096xbf16>, %attn_norm: tensor<4096xbf16>, %wq: tensor<4096x4096xbf16>, %wk: tensor<1024x4096xbf16>, %wv: tensor<1024x4096xbf16>, %wo: tensor<4096x4096xbf16>, %cos: tensor<1x1x1x64xbf16>, %sin: tensor<1x1x1x64xbf16>, %pos: tensor<1xi32>, %k_cache: tensor<1x8x1024x128xbf16> {nn.donated}, %v_cache: tensor<1x8x1024x128xbf16> {nn.donated}, %mlp_norm: tensor<4096xbf16>, %w_gate: tensor<14336x4096xbf16>, %w_up: tensor<14336x4096xbf16>, %w_down: tensor<4096x14336xbf16>) -> tensor<1x4096xbf16> {
  %h = nn.rms_norm %x, %attn_norm {epsilon = 1.0e-05 : f32} : (tensor<1x4096xbf16>, tensor<4096xbf16>) -> tensor<1x4096xbf16>
  %q = nn.linear %h, %wq : (tensor<1x4096xbf16>, tensor<4096x4096xbf16>) -> tensor<1x4096xbf16>
  %k = nn.linear %h, %wk : (tensor<1x4096xbf16>, tensor<1024x4096xbf16>) -> tensor<1x1024xbf16>
  %v = nn.linear %h, %wv : (tensor<1x4096xbf16>, tensor<1024x4096xbf16>) -> tensor<1x1024xbf16>
  %q4 = nn.reshape %q : (tensor<1x4096xbf16>) -> tensor<1x32x1x128xbf16>
  %k4 = nn.reshape %k : (tensor<1x1024xbf16>) -> tensor<1x8x1x128xbf16>
  %v4 = nn.reshape %v : (tensor<1x1024xbf16>) -> tensor<1x8x1x128xbf16>
  %qr = nn.rope %q4, %cos, %sin : (tensor<1x32x1x128xbf16>, tensor<1x1x1x64xbf16>, tensor<1x1x1x64xbf16>) -> tensor<1x32x1x128xbf16>
  %kr = nn.rope %k4, %cos, %sin : (tensor<1x8x1x128xbf16>, tensor<1x1x1x64xbf16>, tensor<1x1x1x64xbf16>) -> tensor<1x8x1x128xbf16>
  %kf = nn.cache_write %k_cache, %kr, %pos {dim = 2 : i64} : (tensor<1x8x1024x128xbf16>, tensor<1x8x1x128xbf16>, tensor<1xi32>) -> tensor<1x8x1024x128xbf16>
  %vf = nn.cache_write %v_cache, %v4, %pos {dim = 2 : i64} : (tensor<1x8x1024x128xbf16>, tensor<1x8x1x128xbf16>, tensor<1xi32>) -> tensor<1x8x1024x128xbf16>
  %kv_len = nn.step %pos {offset = 1 : i64} : (tensor<1xi32>) -> tensor<1xi32>
  %att = nn.attention %qr, %kf, %vf, %kv_len {scale = 0.08838834764831843 : f32, causal = false} : (tensor<1x32x1x128xbf16>, tensor<1x8x1024x128xbf16>, tensor<1x8x1024x128xbf16>, tensor<1xi32>) -> tensor<1x32x1x128xbf16>
  %att2 = nn.reshape %att : (tensor<1x32x1x128xbf16>) -> tensor<1x4096xbf16>
  %o = nn.linear %att2, %wo : (tensor<1x4096xbf16>, tensor<4096x4096xbf16>) -> tensor<1x4096xbf16>
  %r = nn.add %x, %o : (tensor<1x4096xbf16>, tensor<1x4096xbf16>) -> tensor<1x4096xbf16>
  %h2 = nn.rms_norm %r, %mlp_norm {epsilon = 1.0e-05 : f32} : (tensor<1x4096xbf16>, tensor<4096xbf16>) -> tensor<1x4096xbf16>
  %g = nn.linear %h2, %w_gate : (tensor<1x4096xbf16>, tensor<14336x4096xbf16>) -> tensor<1x14336xbf16>
  %u = nn.linear %h2, %w_up : (tensor<1x4096xbf16>, tensor<14336x4096xbf16>) -> tensor<1x14336xbf16>
  %gs = nn.silu %g : (tensor<1x14336xbf16>) -> tensor<1x14336xbf16>
  %m = nn.mul %gs, %u : (tensor<1x14336xbf16>, tensor<1x14336xbf16>) -> tensor<1x14336xbf16>
  %d = nn.linear %m, %w_down : (tensor<1x14336xbf16>, tensor<4096x14336xbf16>) -> tensor<1x4096xbf16>
  %y = nn.add %r, %d : (tensor<1x4096xbf16>, tensor<1x4096xbf16>) -> tensor<1x4096xbf16>
  func.return %y : tensor<1x4096xbf16>
}
