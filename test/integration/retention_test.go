package integration

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/useshards/shard/client"
)

// forkCheckpoint is the checkpoint fork f of src was made from.
func forkCheckpoint(t *testing.T, src *client.Sandbox) client.Checkpoint {
	t.Helper()
	cks, err := need(t).c.Checkpoints(ctxT(t), src.Session)
	if err != nil || len(cks) == 0 || cks[len(cks)-1].Kind != "fork" {
		t.Fatalf("checkpoints of %s: %+v %v", src.Name, cks, err)
	}
	return cks[len(cks)-1]
}

// imageDir is a checkpoint's memory image on the server's disk.
func imageDir(id string) string { return filepath.Join(E.dataDir, "checkpoints", id) }

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// TestForkRetention, on runsc: a fork's checkpoint goes with the last
// sandbox whose resume starts from it, its files and space too; kept with
// keep_checkpoint; kept while a fork's session can resume from it (a
// resumed sandbox then holds it); remove --checkpoints takes a sandbox's
// checkpoints, or nothing while another sandbox needs one.
func TestForkRetention(t *testing.T) {
	e := need(t)
	t.Run("source and fork removed", func(t *testing.T) {
		src := create(t, client.CreateRequest{Image: busybox, Name: "ret-src", Memory: jsonRaw("128MiB")})
		f, err := e.c.Fork(ctxT(t), src.ID, client.ForkRequest{Name: "ret-fork"})
		if err != nil {
			t.Fatal(err)
		}
		ck := forkCheckpoint(t, src)
		if !ck.AutoRemove || ck.Size <= 0 || !exists(imageDir(ck.ID)) {
			t.Fatalf("the fork's checkpoint: %+v, image on disk %v", ck, exists(imageDir(ck.ID)))
		}
		res, err := e.c.RemoveWith(ctxT(t), f.ID, client.RemoveOptions{Force: true})
		if err != nil || len(res.Checkpoints) != 0 {
			t.Fatalf("remove of the fork: %+v %v (the source still resumes from the checkpoint)", res, err)
		}
		res, err = e.c.RemoveWith(ctxT(t), src.ID, client.RemoveOptions{Force: true})
		if err != nil || !slices.Equal(res.Checkpoints, []string{ck.ID}) || res.FreedBytes < ck.Size/2 {
			t.Fatalf("remove of the source: %+v %v; want checkpoint %s and its %d bytes", res, err, ck.ID, ck.Size)
		}
		_, err = e.c.GetCheckpoint(ctxT(t), ck.ID)
		wantCode(t, "the removed checkpoint", err, 404, "checkpoint_not_found", ck.ID)
		if exists(imageDir(ck.ID)) {
			t.Fatalf("the checkpoint's image %s is still on disk", imageDir(ck.ID))
		}
		// The fork's session cannot resume any more, and says why.
		_, err = e.c.Resume(ctxT(t), f.Session, client.ResumeRequest{})
		wantCode(t, "resume of the removed fork's session", err, 409, "checkpoint_gone", "--keep-checkpoint")
	})
	t.Run("keep_checkpoint", func(t *testing.T) {
		src := create(t, client.CreateRequest{Image: busybox, Name: "ret-keep"})
		f, err := e.c.Fork(ctxT(t), src.ID, client.ForkRequest{KeepCheckpoint: true})
		if err != nil {
			t.Fatal(err)
		}
		ck := forkCheckpoint(t, src)
		t.Cleanup(func() { e.c.RemoveCheckpoint(context.Background(), ck.ID) })
		for _, id := range []string{f.ID, src.ID} {
			if err := e.c.Remove(ctxT(t), id, true); err != nil {
				t.Fatal(err)
			}
		}
		got, err := e.c.GetCheckpoint(ctxT(t), ck.ID)
		if err != nil || got.AutoRemove || !exists(imageDir(ck.ID)) {
			t.Fatalf("the kept checkpoint: %+v %v", got, err)
		}
		out, err := e.c.Resume(ctxT(t), f.Session, client.ResumeRequest{})
		if err != nil || out.Checkpoint != ck.ID {
			t.Fatalf("resume of the removed fork's session: %+v %v", out, err)
		}
		e.c.Remove(ctxT(t), out.Sandbox.ID, true)
	})
	t.Run("a resumed session holds it", func(t *testing.T) {
		src := create(t, client.CreateRequest{Image: busybox, Name: "ret-res"})
		f, err := e.c.Fork(ctxT(t), src.ID, client.ForkRequest{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.c.Remove(context.Background(), f.ID, true) })
		ck := forkCheckpoint(t, src)
		if err := e.c.Remove(ctxT(t), src.ID, true); err != nil {
			t.Fatal(err)
		}
		// The fork's session resumes from it: kept.
		out, err := e.c.Resume(ctxT(t), f.Session, client.ResumeRequest{Name: "ret-resumed"})
		if err != nil || out.Checkpoint != ck.ID {
			t.Fatalf("resume of the fork's session: %+v %v", out, err)
		}
		t.Cleanup(func() { e.c.Remove(context.Background(), out.Sandbox.ID, true) })
		if err := e.c.Remove(ctxT(t), f.ID, true); err != nil {
			t.Fatal(err)
		}
		if !exists(imageDir(ck.ID)) {
			t.Fatal("the checkpoint went while the resumed sandbox's session starts from it")
		}
		res, err := e.c.RemoveWith(ctxT(t), out.Sandbox.ID, client.RemoveOptions{Force: true})
		if err != nil || !slices.Contains(res.Checkpoints, ck.ID) || exists(imageDir(ck.ID)) {
			t.Fatalf("remove of the last sandbox that needed it: %+v %v", res, err)
		}
	})
	t.Run("remove --checkpoints", func(t *testing.T) {
		src := create(t, client.CreateRequest{Image: busybox, Name: "ret-cks"})
		ck, err := e.c.Checkpoint(ctxT(t), src.ID, client.CheckpointRequest{Tag: "mine"})
		if err != nil {
			t.Fatal(err)
		}
		if ck.AutoRemove {
			t.Fatalf("a checkpoint the user took: %+v", ck)
		}
		r, err := e.c.RestoreCheckpoint(ctxT(t), ck.ID, client.RestoreRequest{Name: "ret-cks-restored"})
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.c.RemoveWith(ctxT(t), src.ID, client.RemoveOptions{Force: true, Checkpoints: true})
		wantCode(t, "remove --checkpoints while a restore needs one", err, 409, "checkpoint_in_use", "ret-cks-restored")
		if _, err := e.c.Get(ctxT(t), src.ID); err != nil {
			t.Fatalf("the refused remove removed the sandbox: %v", err)
		}
		if err := e.c.Remove(ctxT(t), r.ID, true); err != nil {
			t.Fatal(err)
		}
		if !exists(imageDir(ck.ID)) {
			t.Fatal("a checkpoint the user took went on its own")
		}
		// The CLI, as a user types it.
		if _, stderr, code := e.cli(t, "", "rm", "--force", "--checkpoints", src.Name); code != 0 || !strings.Contains(stderr, "1 checkpoint(s) removed") {
			t.Fatalf("shard rm --checkpoints: exit %d, %s", code, stderr)
		}
		if exists(imageDir(ck.ID)) {
			t.Fatal("the checkpoint's image is still on disk after rm --checkpoints")
		}
	})
}

// dbBytes is the server's database on disk: the file and its log.
func dbBytes(e *env) int64 {
	var n int64
	for _, s := range []string{"", "-wal"} {
		if st, err := os.Stat(filepath.Join(e.dataDir, "shard.db"+s)); err == nil {
			n += st.Size()
		}
	}
	return n
}

// growLedger runs execs with large arguments in sb until its session has
// added about bytes to the database (4 at a time).
func growLedger(t testing.TB, sb *client.Sandbox, bytes int64) {
	e := need(t)
	arg := strings.Repeat("x", 120<<10) // under 128 KiB, the kernel's bound on one argument
	var n atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n.Add(int64(len(arg))) < bytes {
				if _, err := e.c.Exec(context.Background(), sb.ID, client.ExecRequest{Argv: []string{"true", arg}}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
}

// reclaimed waits until the database is at most want bytes, and returns
// how long that took (or fails after limit).
func reclaimed(t testing.TB, e *env, want int64, limit time.Duration) time.Duration {
	start := time.Now()
	for dbBytes(e) > want {
		if time.Since(start) > limit {
			t.Fatalf("the database is %d bytes %s after ledger rm, want at most %d", dbBytes(e), limit, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

// TestLedgerRmShrinksDatabase: the space of a removed ledger session goes
// back to the filesystem (the database file shrinks), after the answer.
func TestLedgerRmShrinksDatabase(t *testing.T) {
	e := need(t)
	sb := create(t, client.CreateRequest{Image: busybox, Provider: "runc", Name: "ret-ledger"})
	base := dbBytes(e)
	const grow = 64 << 20
	growLedger(t, sb, grow)
	if err := e.c.Remove(ctxT(t), sb.ID, true); err != nil {
		t.Fatal(err)
	}
	full := dbBytes(e)
	if full-base < grow*3/4 {
		t.Fatalf("the database grew by %d bytes, want about %d", full-base, grow)
	}
	if err := e.c.RemoveSession(ctxT(t), sb.Session); err != nil {
		t.Fatal(err)
	}
	took := reclaimed(t, e, full-grow*3/4, time.Minute)
	t.Logf("ledger rm of a %d MiB session: the database from %d to %d bytes in %s", grow>>20, full, dbBytes(e), took)
}
