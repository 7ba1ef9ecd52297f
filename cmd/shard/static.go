//go:build cgo && !race

package main

// A plain `go build ./cmd/shard` (or `go install`) on a machine with a C
// compiler builds with cgo, and the net and os/user packages then link the
// C library dynamically. But this binary is also the agent of every
// sandbox, and must run in images with no libc at all (busybox): so with
// cgo it is linked statically. It never calls the C library's name
// services (getaddrinfo, getpwnam...), whose static forms would load
// shared modules at run time (the linker warns about them): Go's own DNS
// resolver is chosen below (go:debug netdns=go in main.go), and the file
// helper's archives carry numeric owners only (internal/files). A -race
// build stays dynamic (the race runtime needs it); shard serve refuses such
// a binary as an agent, saying why.

// #cgo LDFLAGS: -static
import "C"
