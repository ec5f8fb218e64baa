// The gated MLP of a Llama-style decoder: down(silu(gate(x)) * up(x)).
func.func @gated_mlp(%x: tensor<4x256xbf16>, %w_gate: tensor<512x256xbf16>, %w_up: tensor<512x256xbf16>, %w_down: tensor<256x512xbf16>) -> tensor<4x256xbf16> {
  %g = nn.linear %x, %w_gate : (tensor<4x256xbf16>, tensor<512x256xbf16>) -> tensor<4x512xbf16>
  %u = nn.linear %x, %w_up : (tensor<4x256xbf16>, tensor<512x256xbf16>) -> tensor<4x512xbf16>
  %s = nn.silu %g : (tensor<4x512xbf16>) -> tensor<4x512xbf16>
  %m = nn.mul %s, %u : (tensor<4x512xbf16>, tensor<4x512xbf16>) -> tensor<4x512xbf16>
  %y = nn.linear %m, %w_down : (tensor<4x512xbf16>, tensor<256x512xbf16>) -> tensor<4x256xbf16>
  func.return %y : tensor<4x256xbf16>
}
