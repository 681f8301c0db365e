module libssa/ssa

go 1.19
