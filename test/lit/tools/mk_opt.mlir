// mk-opt's user-facing errors: located, one line plus context, exit code 1, never a traceback.

// RUN: mk-opt %S/Inputs/ok.mlir | filecheck %s --check-prefix=OK
// OK: func.func @f(%a: tensor<2xf32>) -> tensor<2xf32> {
// OK-NEXT: func.return %a : tensor<2xf32>

// RUN: not mk-opt %S/Inputs/bad_syntax.mlir 2>&1 | filecheck %s --check-prefix=SYNTAX
// SYNTAX: bad_syntax.mlir:2:18: error: Expected ':'
// SYNTAX-NEXT: func.return %a tensor<2xf32>
// SYNTAX-NEXT: {{^ +\^$}}
// SYNTAX-NOT: Traceback

// RUN: not mk-opt %S/Inputs/bad_verify.mlir 2>&1 | filecheck %s --check-prefix=VERIFY
// VERIFY: bad_verify.mlir:2:3: error: 'func.return' Expected arguments to have the same types as the function output types
// VERIFY-NOT: Traceback

// RUN: not mk-opt %S/Inputs/ok.mlir -p no-such-pass 2>&1 | filecheck %s --check-prefix=PASS
// PASS: error: Unrecognized passes: ['no-such-pass']

// RUN: not mk-opt %S/Inputs/missing.mlir 2>&1 | filecheck %s --check-prefix=MISSING
// MISSING: error: cannot read input: No such file or directory: {{.*}}missing.mlir

// RUN: mk-opt --list-passes | filecheck %s --check-prefix=LIST
// LIST: canonicalize

// RUN: mk-opt %S/Inputs/ok.mlir -o %t.mlir && mk-opt %t.mlir | filecheck %s --check-prefix=OK
