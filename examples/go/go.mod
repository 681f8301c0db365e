module libssa/examples/agent

go 1.19

require libssa/ssa v0.0.0

replace libssa/ssa => ../../bindings/go
