package main

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestPlainBuildIsStatic: `go build ./cmd/shard` as a newcomer types it,
// with cgo (the default where a C compiler is) and without, makes a binary
// with no dynamic loader, which shard serve accepts as the sandboxes'
// agent. It builds twice (half a minute): it runs with the integration
// tests (SHARD_INTEGRATION=1), where a missing C compiler fails it.
func TestPlainBuildIsStatic(t *testing.T) {
	if os.Getenv("SHARD_INTEGRATION") == "" {
		t.Skip("set SHARD_INTEGRATION=1 to build shard with and without cgo")
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Fatal("gcc is not installed (scripts/install-deps.sh installs it): the build with cgo cannot be checked")
	}
	for _, cgo := range []string{"1", "0"} {
		t.Run("CGO_ENABLED="+cgo, func(t *testing.T) {
			bin := filepath.Join(t.TempDir(), "shard")
			cmd := exec.Command("go", "build", "-o", bin, ".")
			var env []string
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, "CGO_ENABLED=") && !strings.HasPrefix(kv, "GOFLAGS=") {
					env = append(env, kv)
				}
			}
			cmd.Env = append(env, "CGO_ENABLED="+cgo)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("go build: %v\n%s", err, out)
			}
			f, err := elf.Open(bin)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for _, p := range f.Progs {
				if p.Type == elf.PT_INTERP {
					t.Fatalf("the binary built with CGO_ENABLED=%s is dynamically linked (it has an ELF interpreter)", cgo)
				}
			}
			if _, err := f.DynamicSymbols(); err == nil {
				t.Errorf("the binary built with CGO_ENABLED=%s has dynamic symbols", cgo)
			}
			out, err := exec.Command(bin, "--version").CombinedOutput()
			if err != nil {
				t.Fatalf("shard --version: %v\n%s", err, out)
			}
		})
	}
}
