package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/useshards/shard/client"
)

// What one project's attack costs another, and what the store's growth
// costs a create, on a server of this build of its own:
//
//	scripts/test.sh -run '^$' -bench 'Neighbour|StoreGrowth' ./test/integration
//
// BenchmarkNeighbour: project "victim" creates a runc sandbox (and removes
// it) and runs an exec in a sandbox it holds, quietly first, then while
// project "attacker", under a quota, repeats each attack of issue 30 as
// fast as it can: sandboxes until its slots are gone, 4GiB sandboxes past
// its memory, checkpoints past its saved bytes, execs of a 120KiB argv past
// its ledger bytes, and a sandbox writing its whole disk; and, for a
// baseline, a flood of lists (what any client's loop of requests costs,
// refused or not). Ratios are p50
// during over p50 before; any 5xx the victim sees fails the benchmark.
func BenchmarkNeighbour(b *testing.B) {
	e := need(b)
	srv := startSingle(b, e.bin, 3, "--storage-size", "2GiB", "--storage-max", "12GiB")
	ctx := context.Background()
	if _, err := srv.admin.SetProjectQuota(ctx, "attacker", client.ProjectQuota{
		MaxSandboxes: 6, MaxMemoryBytes: 3 << 30, MaxDiskBytes: 3 << 30, MaxSavedBytes: 1 << 30, MaxLedgerBytes: 32 << 20,
	}); err != nil {
		b.Fatal(err)
	}
	proj := func(p string) *client.Client {
		c, err := client.New(client.Options{Socket: srv.socket, Project: p})
		if err != nil {
			b.Fatal(err)
		}
		return c
	}
	victim, attacker := proj("victim"), proj("attacker")
	held, err := victim.Create(ctx, client.CreateRequest{Image: busybox, Provider: "runc", Name: "held"})
	if err != nil {
		b.Fatal(err)
	}
	rounds := envInt("SHARD_BENCH_ROUNDS", 20)
	s := samples{}
	var fives, broken atomic.Int64
	measure := func(phase string) {
		for range rounds {
			t0 := time.Now()
			sb, err := victim.Create(ctx, client.CreateRequest{Image: busybox, Provider: "runc"})
			if err != nil {
				b.Fatalf("victim's create during %s: %v", phase, err)
			}
			s.add("create-"+phase, time.Since(t0))
			if err := victim.Remove(ctx, sb.ID, true); err != nil {
				b.Fatal(err)
			}
			t0 = time.Now()
			res, err := victim.Exec(ctx, held.ID, client.ExecRequest{Argv: []string{"true"}})
			if err != nil || res.ExitCode != 0 {
				b.Fatalf("victim's exec during %s: %v %+v", phase, err, res)
			}
			s.add("exec-"+phase, time.Since(t0))
		}
	}
	// refused counts what the attack was refused, by code; a 5xx other
	// than 507 (the host's own bounds) fails the benchmark.
	var mu sync.Mutex
	refused := map[string]int{}
	refuse := func(err error) {
		var ce *client.Error
		if !errors.As(err, &ce) {
			b.Errorf("attack: %v", err)
			return
		}
		if ce.Status >= 500 && ce.Status != 507 {
			fives.Add(1)
		}
		mu.Lock()
		refused[ce.Code]++
		mu.Unlock()
	}
	attack := func(phase string, step func() error) {
		stop := make(chan struct{})
		done := make(chan struct{})
		n := 0
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := step(); err != nil {
					refuse(err)
					time.Sleep(time.Millisecond) // a refusal is cheap: keep the loop from spinning on a lock
				}
				n++
			}
		}()
		measure(phase)
		close(stop)
		<-done
		fmt.Fprintf(os.Stderr, "BENCH %s attack %s: %d requests, refused %v\n", b.Name(), phase, n, refused)
		mu.Lock()
		clear(refused)
		mu.Unlock()
	}
	measure("quiet")
	// The baseline of any flood: as many cheap calls (a list) as one
	// client sends, none refused.
	attack("requests", func() error {
		_, err := attacker.List(ctx)
		return err
	})
	var made []string
	attack("slots", func() error {
		sb, err := attacker.Create(ctx, client.CreateRequest{Image: busybox, Provider: "runc", Memory: json.RawMessage(`"64MiB"`), Disk: json.RawMessage(`"64MiB"`)})
		if err == nil {
			made = append(made, sb.ID)
		}
		return err
	})
	for _, id := range made[1:] {
		attacker.Remove(ctx, id, true)
	}
	big := made[0]
	attack("memory", func() error {
		sb, err := attacker.Create(ctx, client.CreateRequest{Image: busybox, Provider: "gvisor", Memory: json.RawMessage(`"4GiB"`), Disk: json.RawMessage(`"64MiB"`)})
		if err == nil {
			broken.Add(1) // a 4GiB sandbox past a 3GiB quota
			attacker.Remove(ctx, sb.ID, true)
		}
		return err
	})
	gv, err := attacker.Create(ctx, client.CreateRequest{Image: busybox, Provider: "gvisor", Memory: json.RawMessage(`"512MiB"`), Disk: json.RawMessage(`"64MiB"`)})
	if err != nil {
		b.Fatal(err)
	}
	attack("saved", func() error {
		_, err := attacker.Checkpoint(ctx, gv.ID, client.CheckpointRequest{})
		return err
	})
	argv := []string{"echo", strings.Repeat("a", 120<<10)}
	attack("ledger", func() error {
		_, err := attacker.Exec(ctx, big, client.ExecRequest{Argv: argv})
		return err
	})
	if _, err := srv.admin.SetProjectQuota(ctx, "attacker", client.ProjectQuota{MaxSandboxes: 6, MaxDiskBytes: 3 << 30}); err != nil {
		b.Fatal(err)
	}
	filler, err := attacker.Create(ctx, client.CreateRequest{Image: busybox, Provider: "runc", Disk: json.RawMessage(`"2GiB"`)})
	if err != nil {
		b.Fatal(err)
	}
	attack("disk", func() error {
		_, err := attacker.Exec(ctx, filler.ID, client.ExecRequest{Argv: []string{"sh", "-c", "dd if=/dev/urandom of=/fill bs=1M count=3000 2>/dev/null; rm -f /fill"}})
		if err != nil {
			return err
		}
		sb, err := attacker.Create(ctx, client.CreateRequest{Image: busybox, Provider: "runc", Disk: json.RawMessage(`"2GiB"`)})
		if err == nil {
			broken.Add(1) // a disk past the attacker's 3GiB quota
			attacker.Remove(ctx, sb.ID, true)
		}
		return err
	})
	for _, op := range []string{"create", "exec"} {
		report(b, s, op+"-quiet", op+"-quiet", op+"-requests", op+"-slots", op+"-memory", op+"-saved", op+"-ledger", op+"-disk")
	}
	if n := broken.Load(); n > 0 {
		b.Fatalf("the attacker made %d things past its quota", n)
	}
	if n := fives.Load(); n > 0 {
		b.Fatalf("the attacks saw %d 5xx answers", n)
	}
}

// BenchmarkStoreGrowth: a create (runc, a 2GiB disk) when the store must
// grow for it, and one when it need not, alternated in one run on a server
// of its own whose store starts full: each round creates one it must grow
// for, removes it, and creates one of the same size in the room that gave
// back (kept, so that the store is full again).
func BenchmarkStoreGrowth(b *testing.B) {
	e := need(b)
	rounds := envInt("SHARD_BENCH_ROUNDS", 8)
	srv := startSingle(b, e.bin, 4, "--storage-size", "1GiB", "--storage-max", fmt.Sprintf("%dGiB", 3*rounds+4))
	ctx := context.Background()
	s := samples{}
	disk := json.RawMessage(`"2GiB"`)
	df := func() client.StoreSpace {
		du, err := srv.admin.DiskUsage(ctx)
		if err != nil {
			b.Fatal(err)
		}
		return du.Store
	}
	for range rounds {
		before := df()
		t0 := time.Now()
		g, err := srv.admin.Create(ctx, client.CreateRequest{Image: busybox, Provider: "runc", Disk: disk})
		if err != nil {
			b.Fatal(err)
		}
		d := time.Since(t0)
		if df().SizeBytes <= before.SizeBytes {
			b.Fatalf("the store did not grow for a 2GiB disk with %d free", before.FreeBytes)
		}
		s.add("create-grows", d)
		if err := srv.admin.Remove(ctx, g.ID, true); err != nil {
			b.Fatal(err)
		}
		before = df()
		t0 = time.Now()
		if _, err := srv.admin.Create(ctx, client.CreateRequest{Image: busybox, Provider: "runc", Disk: disk}); err != nil {
			b.Fatal(err)
		}
		d = time.Since(t0)
		if df().SizeBytes != before.SizeBytes {
			b.Fatal("the store grew for a disk that fit")
		}
		s.add("create-fits", d)
	}
	report(b, s, "create-fits", "create-fits", "create-grows")
}
