// RUN: mk-opt %s --split-input-file --verify-diagnostics --parsing-diagnostics | filecheck %s
// Every nn verifier error, located at the offending op, plus a few syntax errors.

// ===== element types and shapes shared by all ops

func.func @f(%x: tensor<8x16xi32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.exp' x must have element type f32, f16 or bf16, got i32
  %0 = nn.exp %x : (tensor<8x16xi32>) -> tensor<8x16xi32>
  func.return
}

// -----

func.func @f(%a: tensor<8x16xf32>, %b: tensor<8x16xf16>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.add' element types differ: a is f32, b is f16
  %0 = nn.add %a, %b : (tensor<8x16xf32>, tensor<8x16xf16>) -> tensor<8x16xf32>
  func.return
}

// -----

func.func @f(%x: tensor<?x4096xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.silu' x has a dynamic shape ?x4096; nn needs static shapes
  %0 = nn.silu %x : (tensor<?x4096xf32>) -> tensor<?x4096xf32>
  func.return
}

// -----

func.func @f(%x: tensor<4x0xf32>, %w: tensor<16x0xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.linear' x is empty (4x0); nn takes no zero-size dimension
  %0 = nn.linear %x, %w : (tensor<4x0xf32>, tensor<16x0xf32>) -> tensor<4x16xf32>
  func.return
}

// -----

func.func @f(%x: tensor<8x16xbf16>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.relu' result element type is f16, expected bf16
  %0 = nn.relu %x : (tensor<8x16xbf16>) -> tensor<8x16xf16>
  func.return
}

// -----

func.func @f(%x: tensor<8x16xbf16>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.gelu' result shape is 16x8, expected 8x16
  %0 = nn.gelu %x : (tensor<8x16xbf16>) -> tensor<16x8xbf16>
  func.return
}

// -----

func.func @f(%x: memref<16xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.neg' x must be a ranked tensor, got memref<16xf32>
  %0 = nn.neg %x : (memref<16xf32>) -> tensor<16xf32>
  func.return
}

// -----

func.func @f(%x: tensor<16xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.sigmoid' result must be a ranked tensor, got tensor<*xf32>
  %0 = nn.sigmoid %x : (tensor<16xf32>) -> tensor<*xf32>
  func.return
}

// ===== attributes

// -----

func.func @f(%x: tensor<8x16xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.scale' property 'factor' expected
  %0 = nn.scale %x : (tensor<8x16xf32>) -> tensor<8x16xf32>
  func.return
}

// -----

func.func @f(%x: tensor<8x16xf32>, %g: tensor<16xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.rms_norm' attribute 'epsilon' must be an f32 float like `1.0 : f32`, got 1.000000e-05 : f64
  %0 = nn.rms_norm %x, %g {epsilon = 1.0e-05} : (tensor<8x16xf32>, tensor<16xf32>) -> tensor<8x16xf32>
  func.return
}

// -----

func.func @f(%x: tensor<8x16xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.reduce_sum' attribute 'dim' must be an i64 integer like `1 : i64`, got 1 : i32
  %0 = nn.reduce_sum %x {dim = 1 : i32} : (tensor<8x16xf32>) -> tensor<8xf32>
  func.return
}

// -----

func.func @f(%x: tensor<8x16xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.reduce_max' attribute 'keepdim' must be true or false, got 1 : i64
  %0 = nn.reduce_max %x {dim = 1 : i64, keepdim = 1} : (tensor<8x16xf32>) -> tensor<8x1xf32>
  func.return
}

// -----

func.func @f(%x: tensor<8x16xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.transpose' attribute 'perm' must be an i64 array like `array<i64: 0, 1>`, got [1 : i64, 0 : i64]
  %0 = nn.transpose %x {perm = [1, 0]} : (tensor<8x16xf32>) -> tensor<16x8xf32>
  func.return
}

// -----

func.func @f(%x: tensor<8x16xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.slice' attribute 'sizes' must be an i64 array like `array<i64: 0, 1>`, got array<i32: 8, 8>
  %0 = nn.slice %x {offsets = array<i64: 0, 0>, sizes = array<i32: 8, 8>} : (tensor<8x16xf32>) -> tensor<8x8xf32>
  func.return
}

// ===== syntax

// -----

// The type list is missing: the parser stops at the next token, on the following line.
func.func @f(%x: tensor<8x16xf32>) {
  %0 = nn.exp %x
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: Expected ':'
  func.return
}

// -----

func.func @f(%x: tensor<8x16xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:21: error: Expected 1 operand type, but got 2
  %0 = nn.exp %x : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  func.return
}

// -----

func.func @f(%x: tensor<8x16xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:20: error: Expected '('
  %0 = nn.exp %x : tensor<8x16xf32>
  func.return
}

// ===== contractions

// -----

func.func @f(%a: tensor<8x4096xbf16>, %b: tensor<4000x6144xbf16>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.matmul' inner dimensions differ: a is 8x4096, b is 4000x6144
  %0 = nn.matmul %a, %b : (tensor<8x4096xbf16>, tensor<4000x6144xbf16>) -> tensor<8x6144xbf16>
  func.return
}

// -----

func.func @f(%a: tensor<4096xbf16>, %b: tensor<4096x6144xbf16>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.matmul' a must have rank >= 2, got rank 1 (4096)
  %0 = nn.matmul %a, %b : (tensor<4096xbf16>, tensor<4096x6144xbf16>) -> tensor<6144xbf16>
  func.return
}

// -----

func.func @f(%a: tensor<2x8x16xf32>, %b: tensor<3x16x4xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.matmul' batch dimensions do not broadcast: a is 2x8x16, b is 3x16x4
  %0 = nn.matmul %a, %b : (tensor<2x8x16xf32>, tensor<3x16x4xf32>) -> tensor<2x8x4xf32>
  func.return
}

// -----

func.func @f(%a: tensor<8x4096xbf16>, %b: tensor<4096x6144xbf16>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.matmul' result shape is 8x6145, expected 8x6144
  %0 = nn.matmul %a, %b : (tensor<8x4096xbf16>, tensor<4096x6144xbf16>) -> tensor<8x6145xbf16>
  func.return
}

// -----

func.func @f(%x: tensor<8x4096xf16>, %w: tensor<6144x4000xf16>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.linear' inner dimensions differ: x is 8x4096, w is 6144x4000 (w is [N, K])
  %0 = nn.linear %x, %w : (tensor<8x4096xf16>, tensor<6144x4000xf16>) -> tensor<8x6144xf16>
  func.return
}

// -----

func.func @f(%x: tensor<8x4096xf16>, %w: tensor<1x6144x4096xf16>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.linear' w must have rank 2 ([N, K]), got rank 3 (1x6144x4096)
  %0 = nn.linear %x, %w : (tensor<8x4096xf16>, tensor<1x6144x4096xf16>) -> tensor<8x6144xf16>
  func.return
}

// ===== broadcasting

// -----

func.func @f(%a: tensor<8x4096xf32>, %b: tensor<8x4000xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.maximum' operands do not broadcast: a is 8x4096, b is 8x4000
  %0 = nn.maximum %a, %b : (tensor<8x4096xf32>, tensor<8x4000xf32>) -> tensor<8x4096xf32>
  func.return
}

// -----

func.func @f(%a: tensor<8x1xf32>, %b: tensor<4xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.div' result shape is 8x1, expected 8x4
  %0 = nn.div %a, %b : (tensor<8x1xf32>, tensor<4xf32>) -> tensor<8x1xf32>
  func.return
}

// ===== reductions, softmax, argmax

// -----

func.func @f(%x: tensor<8x16xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.reduce_sum' dim 2 is out of range for rank 2 (expected -2 <= dim < 2)
  %0 = nn.reduce_sum %x {dim = 2 : i64} : (tensor<8x16xf32>) -> tensor<8xf32>
  func.return
}

// -----

func.func @f(%x: tensor<8x16xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.reduce_mean' dim -3 is out of range for rank 2 (expected -2 <= dim < 2)
  %0 = nn.reduce_mean %x {dim = -3 : i64} : (tensor<8x16xf32>) -> tensor<8xf32>
  func.return
}

// -----

func.func @f(%x: tensor<8x16xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.reduce_max' result shape is 8, expected 8x1
  %0 = nn.reduce_max %x {dim = 1 : i64, keepdim = true} : (tensor<8x16xf32>) -> tensor<8xf32>
  func.return
}

// -----

func.func @f(%x: tensor<8x16xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.softmax' dim 5 is out of range for rank 2 (expected -2 <= dim < 2)
  %0 = nn.softmax %x {dim = 5 : i64} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  func.return
}

// -----

func.func @f(%x: tensor<8x16xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.argmax' result element type is i64, expected i32
  %0 = nn.argmax %x : (tensor<8x16xf32>) -> tensor<8xi64>
  func.return
}

// -----

func.func @f(%x: tensor<8x16xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.argmax' result shape is 8, expected 16
  %0 = nn.argmax %x {dim = 0 : i64} : (tensor<8x16xf32>) -> tensor<8xi32>
  func.return
}

// ===== rms_norm, rope, embedding

// -----

func.func @f(%x: tensor<8x4096xbf16>, %g: tensor<4000xbf16>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.rms_norm' w must be [4096] to match the last dim of x (8x4096), got 4000
  %0 = nn.rms_norm %x, %g : (tensor<8x4096xbf16>, tensor<4000xbf16>) -> tensor<8x4096xbf16>
  func.return
}

// -----

func.func @f(%x: tensor<8x4096xbf16>, %g: tensor<4096xbf16>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.rms_norm' epsilon must be >= 0, got -1.0
  %0 = nn.rms_norm %x, %g {epsilon = -1.0 : f32} : (tensor<8x4096xbf16>, tensor<4096xbf16>) -> tensor<8x4096xbf16>
  func.return
}

// -----

func.func @f(%x: tensor<4x63xf32>, %c: tensor<4x31xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.rope' last dim of x must be even, got 4x63
  %0 = nn.rope %x, %c, %c : (tensor<4x63xf32>, tensor<4x31xf32>, tensor<4x31xf32>) -> tensor<4x63xf32>
  func.return
}

// -----

func.func @f(%x: tensor<4x64xf32>, %c: tensor<4x64xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.rope' cos must end in 32 (half of x's last dim), got 4x64
  %0 = nn.rope %x, %c, %c : (tensor<4x64xf32>, tensor<4x64xf32>, tensor<4x64xf32>) -> tensor<4x64xf32>
  func.return
}

// -----

func.func @f(%x: tensor<2x4x64xf32>, %c: tensor<4x32xf32>, %s: tensor<3x32xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.rope' sin leading dims 3 do not broadcast to x's 2x4
  %0 = nn.rope %x, %c, %s : (tensor<2x4x64xf32>, tensor<4x32xf32>, tensor<3x32xf32>) -> tensor<2x4x64xf32>
  func.return
}

// -----

func.func @f(%x: tensor<4x64xf32>, %c: tensor<4x32xf32>, %s: tensor<4x32xbf16>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.rope' element types differ: cos is f32, sin is bf16
  %0 = nn.rope %x, %c, %s : (tensor<4x64xf32>, tensor<4x32xf32>, tensor<4x32xbf16>) -> tensor<4x64xf32>
  func.return
}

// -----

func.func @f(%t: tensor<1000x64xf16>, %ids: tensor<7xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.embedding' ids must have element type i32 or i64, got f32
  %0 = nn.embedding %t, %ids : (tensor<1000x64xf16>, tensor<7xf32>) -> tensor<7x64xf16>
  func.return
}

// -----

func.func @f(%t: tensor<2x1000x64xf16>, %ids: tensor<7xi32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.embedding' table must have rank 2 ([V, H]), got rank 3 (2x1000x64)
  %0 = nn.embedding %t, %ids : (tensor<2x1000x64xf16>, tensor<7xi32>) -> tensor<7x64xf16>
  func.return
}

// -----

func.func @f(%t: tensor<1000x64xf16>, %ids: tensor<2x7xi64>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.embedding' result shape is 14x64, expected 2x7x64
  %0 = nn.embedding %t, %ids : (tensor<1000x64xf16>, tensor<2x7xi64>) -> tensor<14x64xf16>
  func.return
}

// ===== layout

// -----

func.func @f(%x: tensor<8x4096xbf16>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.reshape' element counts differ: x is 8x4096 (32768 elements), result is 8x4000 (32000 elements)
  %0 = nn.reshape %x : (tensor<8x4096xbf16>) -> tensor<8x4000xbf16>
  func.return
}

// -----

func.func @f(%x: tensor<8x4096xbf16>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.reshape' result element type is f32, expected bf16
  %0 = nn.reshape %x : (tensor<8x4096xbf16>) -> tensor<32768xf32>
  func.return
}

// -----

func.func @f(%x: tensor<8x16xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.transpose' perm has 3 entries but x has rank 2
  %0 = nn.transpose %x {perm = array<i64: 2, 1, 0>} : (tensor<8x16xf32>) -> tensor<16x8xf32>
  func.return
}

// -----

func.func @f(%x: tensor<8x16xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.transpose' perm [1, 1] is not a permutation of 0..1
  %0 = nn.transpose %x {perm = array<i64: 1, 1>} : (tensor<8x16xf32>) -> tensor<16x16xf32>
  func.return
}

// -----

func.func @f(%x: tensor<8x16xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.transpose' result shape is 8x16, expected 16x8
  %0 = nn.transpose %x {perm = array<i64: 1, 0>} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  func.return
}

// -----

func.func @f(%x: tensor<8x16xf32>, %y: tensor<8x16x1xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.concat' ranks differ: inputs[0] is 8x16, inputs[1] is 8x16x1
  %0 = nn.concat %x, %y {dim = 0 : i64} : (tensor<8x16xf32>, tensor<8x16x1xf32>) -> tensor<16x16xf32>
  func.return
}

// -----

func.func @f(%x: tensor<8x16xf32>, %y: tensor<4x8xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.concat' dims other than 0 differ: inputs[0] is 8x16, inputs[1] is 4x8
  %0 = nn.concat %x, %y {dim = 0 : i64} : (tensor<8x16xf32>, tensor<4x8xf32>) -> tensor<12x16xf32>
  func.return
}

// -----

func.func @f(%x: tensor<8x16xf32>, %y: tensor<4x16xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.concat' result shape is 8x32, expected 12x16
  %0 = nn.concat %x, %y {dim = -2 : i64} : (tensor<8x16xf32>, tensor<4x16xf32>) -> tensor<8x32xf32>
  func.return
}

// -----

func.func @f(%x: tensor<8x16xf32>, %y: tensor<8x16xf16>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.concat' element types differ: inputs[0] is f32, inputs[1] is f16
  %0 = nn.concat %x, %y {dim = 1 : i64} : (tensor<8x16xf32>, tensor<8x16xf16>) -> tensor<8x32xf32>
  func.return
}

// -----

func.func @f() {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.concat' needs at least one input
  %0 = nn.concat {dim = 0 : i64} : () -> tensor<8xf32>
  func.return
}

// -----

func.func @f(%x: tensor<8x16xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.slice' offsets has 1 entries but x has rank 2
  %0 = nn.slice %x {offsets = array<i64: 0>, sizes = array<i64: 4, 4>} : (tensor<8x16xf32>) -> tensor<4x4xf32>
  func.return
}

// -----

func.func @f(%x: tensor<8x16xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.slice' slice [6, 10) of dim 0 is out of bounds for x (8x16)
  %0 = nn.slice %x {offsets = array<i64: 6, 0>, sizes = array<i64: 4, 16>} : (tensor<8x16xf32>) -> tensor<4x16xf32>
  func.return
}

// -----

func.func @f(%x: tensor<8x16xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.slice' result shape is 4x8, expected 4x16
  %0 = nn.slice %x {offsets = array<i64: 0, 0>, sizes = array<i64: 4, 16>} : (tensor<8x16xf32>) -> tensor<4x8xf32>
  func.return
}

// ===== attention

// -----

func.func @f(%q: tensor<8x1x64xf32>, %k: tensor<1x8x16x64xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.attention' q must have rank 4 ([B, Hq, Sq, D]), got rank 3 (8x1x64)
  %0 = nn.attention %q, %k, %k {scale = 1.0 : f32} : (tensor<8x1x64xf32>, tensor<1x8x16x64xf32>, tensor<1x8x16x64xf32>) -> tensor<8x1x64xf32>
  func.return
}

// -----

func.func @f(%q: tensor<1x8x1x64xf32>, %k: tensor<1x8x16x64xf32>, %v: tensor<1x8x15x64xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.attention' k and v shapes differ: k is 1x8x16x64, v is 1x8x15x64
  %0 = nn.attention %q, %k, %v {scale = 1.0 : f32} : (tensor<1x8x1x64xf32>, tensor<1x8x16x64xf32>, tensor<1x8x15x64xf32>) -> tensor<1x8x1x64xf32>
  func.return
}

// -----

func.func @f(%q: tensor<2x8x1x64xf32>, %k: tensor<1x8x16x64xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.attention' batch sizes differ: q is 2x8x1x64, k is 1x8x16x64
  %0 = nn.attention %q, %k, %k {scale = 1.0 : f32} : (tensor<2x8x1x64xf32>, tensor<1x8x16x64xf32>, tensor<1x8x16x64xf32>) -> tensor<2x8x1x64xf32>
  func.return
}

// -----

func.func @f(%q: tensor<1x8x1x64xf32>, %k: tensor<1x8x16x128xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.attention' head dims differ: q is 1x8x1x64, k is 1x8x16x128
  %0 = nn.attention %q, %k, %k {scale = 1.0 : f32} : (tensor<1x8x1x64xf32>, tensor<1x8x16x128xf32>, tensor<1x8x16x128xf32>) -> tensor<1x8x1x64xf32>
  func.return
}

// -----

func.func @f(%q: tensor<1x8x1x64xf32>, %k: tensor<1x3x16x64xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.attention' query heads Hq = 8 must be a multiple of key/value heads Hkv = 3
  %0 = nn.attention %q, %k, %k {scale = 1.0 : f32} : (tensor<1x8x1x64xf32>, tensor<1x3x16x64xf32>, tensor<1x3x16x64xf32>) -> tensor<1x8x1x64xf32>
  func.return
}

// -----

func.func @f(%q: tensor<2x8x1x64xf32>, %k: tensor<2x2x16x64xf32>, %len: tensor<2xi64>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.attention' kv_len must be tensor<2xi32> ([B] i32), got tensor<2xi64>
  %0 = nn.attention %q, %k, %k, %len {scale = 1.0 : f32} : (tensor<2x8x1x64xf32>, tensor<2x2x16x64xf32>, tensor<2x2x16x64xf32>, tensor<2xi64>) -> tensor<2x8x1x64xf32>
  func.return
}

// -----

func.func @f(%q: tensor<2x8x1x64xf32>, %k: tensor<2x2x16x64xf32>, %len: tensor<1xi32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.attention' kv_len must be tensor<2xi32> ([B] i32), got tensor<1xi32>
  %0 = nn.attention %q, %k, %k, %len {scale = 1.0 : f32} : (tensor<2x8x1x64xf32>, tensor<2x2x16x64xf32>, tensor<2x2x16x64xf32>, tensor<1xi32>) -> tensor<2x8x1x64xf32>
  func.return
}

// -----

func.func @f(%q: tensor<1x8x32x64xf32>, %k: tensor<1x8x16x64xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.attention' causal attention needs Sq <= S, got Sq = 32, S = 16
  %0 = nn.attention %q, %k, %k {scale = 1.0 : f32, causal = true} : (tensor<1x8x32x64xf32>, tensor<1x8x16x64xf32>, tensor<1x8x16x64xf32>) -> tensor<1x8x32x64xf32>
  func.return
}

// -----

func.func @f(%q: tensor<1x8x1x64xf32>, %k: tensor<1x8x16x64xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.attention' property 'scale' expected
  %0 = nn.attention %q, %k, %k : (tensor<1x8x1x64xf32>, tensor<1x8x16x64xf32>, tensor<1x8x16x64xf32>) -> tensor<1x8x1x64xf32>
  func.return
}

// -----

func.func @f(%q: tensor<1x8x1x64xf32>, %k: tensor<1x8x16x64xbf16>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.attention' element types differ: q is f32, k is bf16
  %0 = nn.attention %q, %k, %k {scale = 1.0 : f32} : (tensor<1x8x1x64xf32>, tensor<1x8x16x64xbf16>, tensor<1x8x16x64xbf16>) -> tensor<1x8x1x64xf32>
  func.return
}

// ===== decode loop: nn.step, nn.cache_write, {nn.donated}, nn.steps

// -----

func.func @f(%p: tensor<1xf32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.step' base must have element type i32 or i64, got f32
  %0 = nn.step %p : (tensor<1xf32>) -> tensor<1xf32>
  func.return
}

// -----

func.func @f(%p: tensor<2xi32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.step' base 2 does not broadcast to the result 3
  %0 = nn.step %p : (tensor<2xi32>) -> tensor<3xi32>
  func.return
}

// -----

func.func @f(%c: tensor<2x4x16x8xbf16>, %n: tensor<2x4x1x8xf32>, %i: tensor<1xi32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.cache_write' new has element type f32, cache has bf16
  %0 = nn.cache_write %c, %n, %i {dim = 2 : i64} : (tensor<2x4x16x8xbf16>, tensor<2x4x1x8xf32>, tensor<1xi32>) -> tensor<2x4x16x8xbf16>
  func.return
}

// -----

func.func @f(%c: tensor<2x4x16x8xbf16>, %n: tensor<2x4x1x4xbf16>, %i: tensor<1xi32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.cache_write' new 2x4x1x4 does not fit cache 2x4x16x8 along dim 2
  %0 = nn.cache_write %c, %n, %i {dim = 2 : i64} : (tensor<2x4x16x8xbf16>, tensor<2x4x1x4xbf16>, tensor<1xi32>) -> tensor<2x4x16x8xbf16>
  func.return
}

// -----

func.func @f(%c: tensor<16x2xi32>, %n: tensor<1x2xi32>, %i: tensor<16xi32>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.cache_write' index must have shape [1], got [16]
  %0 = nn.cache_write %c, %n, %i {dim = 0 : i64} : (tensor<16x2xi32>, tensor<1x2xi32>, tensor<16xi32>) -> tensor<16x2xi32>
  func.return
}

// -----

// CHECK: invalid.mlir:[[# @LINE + 1]]:1: error: 'func.func' @f: donated argument #0 must be the cache of exactly one cache write, found 0
func.func @f(%c: tensor<16x2xi32> {nn.donated}) -> tensor<16x2xi32> {
  func.return %c : tensor<16x2xi32>
}

// -----

// CHECK: invalid.mlir:[[# @LINE + 1]]:1: error: 'func.func' @f: 'nn.steps' must be >= 1, got 0
func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> attributes {nn.steps = 0 : i64} {
  func.return %x : tensor<4xf32>
}

// -----

// CHECK: invalid.mlir:[[# @LINE + 1]]:1: error: 'func.func' @f: donated argument #0 is used by 'func.return' after its in-place write; use the write's result instead
func.func @f(%c: tensor<4x2xf32> {nn.donated}, %n: tensor<1x2xf32>, %i: tensor<1xi32>) -> tensor<4x2xf32> {
  %w = nn.cache_write %c, %n, %i {dim = 0 : i64} : (tensor<4x2xf32>, tensor<1x2xf32>, tensor<1xi32>) -> tensor<4x2xf32>
  func.return %c : tensor<4x2xf32>
}

// -----

// CHECK: invalid.mlir:[[# @LINE + 1]]:1: error: 'func.func' @f: donated argument #0 is used by 'nn.exp' after its in-place write; use the write's result instead
func.func @f(%c: tensor<4x2xf32> {nn.donated}, %n: tensor<1x2xf32>, %i: tensor<1xi32>) -> tensor<4x2xf32> {
  %w = nn.cache_write %c, %n, %i {dim = 0 : i64} : (tensor<4x2xf32>, tensor<1x2xf32>, tensor<1xi32>) -> tensor<4x2xf32>
  %e = nn.exp %c : (tensor<4x2xf32>) -> tensor<4x2xf32>
  func.return %e : tensor<4x2xf32>
}

// -----

// ===== a value used before its definition (the parser resolves the name to the later value)

func.func @f(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %b = nn.relu %a : (tensor<4x8xf32>) -> tensor<4x8xf32>
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.mul' operand #1 (%d) is used before its definition
  %c = nn.mul %b, %d : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %d = nn.add %c, %a : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  func.return %d : tensor<4x8xf32>
}

// -----

func.func @f(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
// CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'nn.sigmoid' operand #0 (%s) is used before its definition
  %s = nn.sigmoid %s : (tensor<4x8xf32>) -> tensor<4x8xf32>
  func.return %s : tensor<4x8xf32>
}
