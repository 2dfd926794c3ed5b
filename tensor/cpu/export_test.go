package cpu

// EachISA is eachISA for the package's external tests (conformance_test.go).
var EachISA = eachISA
