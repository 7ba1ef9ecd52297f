package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/useshards/shard/internal/provider"
	"golang.org/x/sys/unix"
)

// Restore starts a prepared sandbox (created, its memory copied: Prepare or
// PrepareAhead) from the checkpoint image in dir. It calls the Sentry's
// restore directly on its control socket, with the image's files opened
// here, then writes runsc's container state as `runsc restore` would (the
// container running, its sandbox restored), so that runsc's other verbs
// (exec, kill, delete) find it as after the CLI. No runsc process: the CLI
// is a 100 MB Go binary that starts, loads the container's state and
// scrapes the network namespace again (runsc create sent the same links,
// which the Sentry keeps until the restore uses them), ~60 ms of a fork.
//
// A sandbox given its memory file (Prepare) adopts it and loads no page;
// otherwise pages load in the background (the sandbox runs meanwhile, and
// waits only for a page it touches that has not arrived).
func (p *Provider) Restore(ctx context.Context, inst *provider.Instance, dir string) error {
	if p.unpatchedRunsc(ctx) != "" {
		return p.restoreCLI(ctx, inst, dir) // its create set no network up
	}
	files, haveMemory, err := p.restoreFiles(inst.ID, dir)
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	if err != nil {
		return fmt.Errorf("restore %s: %w", inst.ID, err)
	}
	arg := map[string]any{
		"HavePagesFile":    true,
		"Background":       true,
		"have_memory_file": haveMemory,
	}
	if inst.Spec != nil && inst.Spec.Hostname != "" {
		// The spec's now, not the one the sandbox was created with (a
		// sandbox made ahead had its id for a name).
		arg["hostname"] = inst.Spec.Hostname
	}
	if err := p.controlCallFiles(ctx, inst.ID, "containerManager.Restore", arg, files); err != nil {
		return fmt.Errorf("restore %s: %w", inst.ID, err)
	}
	if haveMemory {
		os.Remove(p.forkMemory(inst.ID)) // the Sentry holds it open now
	}
	if err := p.markRestored(inst.ID); err != nil {
		return fmt.Errorf("restore %s: runsc state: %w", inst.ID, err)
	}
	return nil
}

// restoreCLI is Restore through `runsc restore`, for a runsc that is not
// the patched build (whose create cannot set the network up).
func (p *Provider) restoreCLI(ctx context.Context, inst *provider.Instance, dir string) error {
	args := []string{"restore", "--detach", "--background"}
	if bigPagesOnDisk(dir) {
		args = append(args, "--direct")
	}
	args = append(args, "--image-path", dir, "--bundle", inst.Bundle, inst.ID)
	return p.Detached(ctx, inst, nil, args...)
}

// restoreFiles opens what containerManager.Restore takes, in its order: the
// state file, the pages' metadata and the pages, then the sandbox's own
// copy of the memory file if Prepare made one.
func (p *Provider) restoreFiles(id, dir string) (files []*os.File, haveMemory bool, err error) {
	for _, name := range []string{"checkpoint.img", "pages_meta.img"} {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			return files, false, err
		}
		files = append(files, f)
	}
	flags := os.O_RDONLY
	mem := p.forkMemory(id)
	haveMemory = fileExists(mem)
	if !haveMemory && bigPagesOnDisk(dir) {
		flags |= syscall.O_DIRECT
	}
	pages, err := os.OpenFile(filepath.Join(dir, pagesFile), flags, 0)
	if err != nil {
		return files, false, err
	}
	files = append(files, pages)
	if haveMemory {
		f, err := os.OpenFile(mem, os.O_RDWR, 0)
		if err != nil {
			return files, false, err
		}
		files = append(files, f)
	}
	return files, haveMemory, nil
}

// bigPagesOnDisk says whether dir's pages file is a big one on disk, which
// a restore reads with O_DIRECT: else the pages read would fill page cache
// charged to the new sandbox (at 1 GiB resident: 3.1 s to a usable fork
// buffered, 1.8 s direct). A small one is read through the page cache,
// which then serves the next restore of the same image (an environment's)
// from memory; pages still in RAM (a link to them) are read as they are.
func bigPagesOnDisk(dir string) bool {
	st, err := os.Lstat(filepath.Join(dir, pagesFile))
	return err == nil && st.Mode().IsRegular() && st.Size() > ramImageMax
}

// markRestored writes into runsc's state of container id what `runsc
// restore` writes once the Sentry restored it: status running, and its
// sandbox restored. It holds runsc's lock of the container's state (a flock
// of its .lock file) meanwhile, as runsc does, and keeps every other field
// as runsc wrote it.
func (p *Provider) markRestored(id string) error {
	base := filepath.Join(p.opts.Root, id+"_sandbox:"+id)
	lock, err := os.OpenFile(base+".lock", os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := flock(lock); err != nil {
		return err
	}
	defer unix.Flock(int(lock.Fd()), unix.LOCK_UN)
	b, err := os.ReadFile(base + ".state")
	if err != nil {
		return err
	}
	var st map[string]json.RawMessage
	if err := json.Unmarshal(b, &st); err != nil {
		return err
	}
	var sb map[string]json.RawMessage
	if err := json.Unmarshal(st["sandbox"], &sb); err != nil {
		return fmt.Errorf("its sandbox: %w", err)
	}
	var status string
	json.Unmarshal(st["status"], &status)
	if status != "created" {
		return fmt.Errorf("container is %q, not created", status)
	}
	sb["restored"] = json.RawMessage("true")
	if st["sandbox"], err = json.Marshal(sb); err != nil {
		return err
	}
	st["status"] = json.RawMessage(`"running"`)
	out, err := json.Marshal(st)
	if err != nil {
		return err
	}
	// As runsc writes it: in place (a reader takes the lock first).
	return os.WriteFile(base+".state", out, 0o640)
}

// flock takes an exclusive flock of f, waiting at most 10 s (a runsc
// process holding it longer is stuck).
func flock(f *os.File) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lock %s: held by another runsc for 10s", f.Name())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
