package sandbox

import (
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// installAgent copies the shard binary into DataDir/agent/<hash>/shard and
// returns that directory, which every sandbox mounts read-only at /.shard.
// A copy per content hash (not the running binary's path) means rebuilding
// shard never changes what a running sandbox has mounted, and sandboxes of
// an older server keep their own agent. Old copies are kept: a running
// sandbox started by an older server, and every fork of it (whose memory
// maps that very file), mount the copy its record names.
func installAgent(dataDir, bin string) (string, error) {
	if err := checkStatic(bin); err != nil {
		return "", err
	}
	f, err := os.Open(bin)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	dir := filepath.Join(dataDir, "agent", hex.EncodeToString(h.Sum(nil))[:16])
	dst := filepath.Join(dir, "shard")
	if _, err := os.Stat(dst); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if _, err := f.Seek(0, 0); err != nil {
		return "", err
	}
	out, err := os.OpenFile(dst+".tmp", os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		return "", err
	}
	if _, err := io.Copy(out, f); err != nil {
		out.Close()
		return "", err
	}
	if err := out.Close(); err != nil {
		return "", err
	}
	return dir, os.Rename(dst+".tmp", dst)
}

// checkStatic makes sure the binary needs no dynamic loader: it runs inside
// images that may have no libc at all (busybox), so it must be built with
// CGO_ENABLED=0.
func checkStatic(bin string) error {
	f, err := elf.Open(bin)
	if err != nil {
		return fmt.Errorf("%s: %w", bin, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked; the agent it provides must run in any image: build shard with a plain go build (it links statically with cgo too), or CGO_ENABLED=0; not with -race", bin)
		}
	}
	return nil
}
