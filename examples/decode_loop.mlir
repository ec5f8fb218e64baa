// A one-layer toy language model generating 4 tokens in one call: each step reads the current token from the donated history, writes its keys and values into the donated caches in place, attends over the cached prefix, and writes the greedy next token back.
func.func @decode_loop(%tokens: tensor<24x2xi32> {nn.donated}, %pos: tensor<1xi32>, %embed: tensor<64x64xbf16>, %cos: tensor<24x8xf32>, %sin: tensor<24x8xf32>, %attn_norm: tensor<64xbf16>, %wq: tensor<64x64xbf16>, %wk: tensor<32x64xbf16>, %wv: tensor<32x64xbf16>, %wo: tensor<64x64xbf16>, %final_norm: tensor<64xbf16>, %k_cache: tensor<2x2x24x16xbf16> {nn.donated}, %v_cache: tensor<2x2x24x16xbf16> {nn.donated}) -> (tensor<24x2xi32>, tensor<2x64xbf16>) attributes {nn.steps = 4 : i64} {
  %p = nn.step %pos : (tensor<1xi32>) -> tensor<1xi32>
  %p1 = nn.step %pos {offset = 1 : i64} : (tensor<1xi32>) -> tensor<1xi32>
  %kv_len = nn.step %pos {offset = 1 : i64} : (tensor<1xi32>) -> tensor<2xi32>
  %tok = nn.embedding %tokens, %p : (tensor<24x2xi32>, tensor<1xi32>) -> tensor<1x2xi32>
  %x3 = nn.embedding %embed, %tok : (tensor<64x64xbf16>, tensor<1x2xi32>) -> tensor<1x2x64xbf16>
  %x = nn.reshape %x3 : (tensor<1x2x64xbf16>) -> tensor<2x64xbf16>
  %c = nn.embedding %cos, %p : (tensor<24x8xf32>, tensor<1xi32>) -> tensor<1x8xf32>
  %s = nn.embedding %sin, %p : (tensor<24x8xf32>, tensor<1xi32>) -> tensor<1x8xf32>
  %h = nn.rms_norm %x, %attn_norm {epsilon = 1.0e-05 : f32} : (tensor<2x64xbf16>, tensor<64xbf16>) -> tensor<2x64xbf16>
  %q = nn.linear %h, %wq : (tensor<2x64xbf16>, tensor<64x64xbf16>) -> tensor<2x64xbf16>
  %k = nn.linear %h, %wk : (tensor<2x64xbf16>, tensor<32x64xbf16>) -> tensor<2x32xbf16>
  %v = nn.linear %h, %wv : (tensor<2x64xbf16>, tensor<32x64xbf16>) -> tensor<2x32xbf16>
  %q4 = nn.reshape %q : (tensor<2x64xbf16>) -> tensor<2x4x1x16xbf16>
  %k4 = nn.reshape %k : (tensor<2x32xbf16>) -> tensor<2x2x1x16xbf16>
  %v4 = nn.reshape %v : (tensor<2x32xbf16>) -> tensor<2x2x1x16xbf16>
  %qr = nn.rope %q4, %c, %s : (tensor<2x4x1x16xbf16>, tensor<1x8xf32>, tensor<1x8xf32>) -> tensor<2x4x1x16xbf16>
  %kr = nn.rope %k4, %c, %s : (tensor<2x2x1x16xbf16>, tensor<1x8xf32>, tensor<1x8xf32>) -> tensor<2x2x1x16xbf16>
  %kc = nn.cache_write %k_cache, %kr, %p {dim = 2 : i64} : (tensor<2x2x24x16xbf16>, tensor<2x2x1x16xbf16>, tensor<1xi32>) -> tensor<2x2x24x16xbf16>
  %vc = nn.cache_write %v_cache, %v4, %p {dim = 2 : i64} : (tensor<2x2x24x16xbf16>, tensor<2x2x1x16xbf16>, tensor<1xi32>) -> tensor<2x2x24x16xbf16>
  %att = nn.attention %qr, %kc, %vc, %kv_len {scale = 0.25 : f32, causal = false} : (tensor<2x4x1x16xbf16>, tensor<2x2x24x16xbf16>, tensor<2x2x24x16xbf16>, tensor<2xi32>) -> tensor<2x4x1x16xbf16>
  %att2 = nn.reshape %att : (tensor<2x4x1x16xbf16>) -> tensor<2x64xbf16>
  %o = nn.linear %att2, %wo : (tensor<2x64xbf16>, tensor<64x64xbf16>) -> tensor<2x64xbf16>
  %r = nn.add %x, %o : (tensor<2x64xbf16>, tensor<2x64xbf16>) -> tensor<2x64xbf16>
  %hf = nn.rms_norm %r, %final_norm {epsilon = 1.0e-05 : f32} : (tensor<2x64xbf16>, tensor<64xbf16>) -> tensor<2x64xbf16>
  %logits = nn.linear %hf, %embed : (tensor<2x64xbf16>, tensor<64x64xbf16>) -> tensor<2x64xbf16>
  %next = nn.argmax %logits {dim = -1 : i64} : (tensor<2x64xbf16>) -> tensor<2xi32>
  %next2 = nn.reshape %next : (tensor<2xi32>) -> tensor<1x2xi32>
  %tokens2 = nn.cache_write %tokens, %next2, %p1 {dim = 0 : i64} : (tensor<24x2xi32>, tensor<1x2xi32>, tensor<1xi32>) -> tensor<24x2xi32>
  func.return %tokens2, %logits : tensor<24x2xi32>, tensor<2x64xbf16>
}
