// Embedding lookup, final norm, lm_head and greedy sampling: the ends of a decode step.
func.func @lm_head_argmax(%ids: tensor<4xi32>, %embed: tensor<1000x128xbf16>, %norm: tensor<128xbf16>, %lm_head: tensor<1000x128xbf16>) -> tensor<4xi32> {
  %h = nn.embedding %embed, %ids : (tensor<1000x128xbf16>, tensor<4xi32>) -> tensor<4x128xbf16>
  %n = nn.rms_norm %h, %norm {epsilon = 1.0e-05 : f32} : (tensor<4x128xbf16>, tensor<128xbf16>) -> tensor<4x128xbf16>
  %logits = nn.linear %n, %lm_head : (tensor<4x128xbf16>, tensor<1000x128xbf16>) -> tensor<4x1000xbf16>
  %next = nn.argmax %logits {dim = -1 : i64} : (tensor<4x1000xbf16>) -> tensor<4xi32>
  func.return %next : tensor<4xi32>
}
