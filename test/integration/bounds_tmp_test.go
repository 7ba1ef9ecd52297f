package integration

import (
	"strings"
	"testing"

	"github.com/useshards/shard/client"
)

// TestTmpFill: writing to /tmp far past --memory fails, at worst, with a
// full disk, and the sandbox stays usable: rm works, commands run. Under
// gVisor /tmp was a tmpfs in the sandbox's memory: the write took the
// sandbox past its bound, the OOM guard killed every later command (rm
// too: the memory was held by a file, not a process) and burned CPU. Now
// /tmp is the rootfs's directory, on disk, under both providers.
func TestTmpFill(t *testing.T) {
	e := need(t)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: prov, Memory: jsonRaw("256MiB"), Disk: jsonRaw("2GiB")})
			if out := execOK(t, sb.ID, "sh", "-c", "grep ' /tmp ' /proc/mounts || echo none"); out != "none\n" {
				t.Errorf("/tmp is a mount of its own: %q, want the rootfs's directory", out)
			}
			res, err := e.c.Exec(ctxT(t), sb.ID, client.ExecRequest{Argv: []string{"sh", "-c",
				"dd if=/dev/zero of=/tmp/x bs=1M count=700 2>&1; ls -l /tmp/x"}})
			if err != nil {
				t.Fatal(err)
			}
			if res.OOM || res.Signal != 0 {
				t.Fatalf("dd of 700 MiB into /tmp under --memory 256MiB was killed: %+v %q", res, res.Stdout)
			}
			if !strings.Contains(string(res.Stdout), "734003200") {
				t.Errorf("dd of 700 MiB into /tmp: %q, want a 734003200-byte file", res.Stdout)
			}
			execOK(t, sb.ID, "rm", "/tmp/x")
			if got := execOK(t, sb.ID, "sh", "-c", "echo fits > /tmp/small && cat /tmp/small"); got != "fits\n" {
				t.Fatalf("after the fill: %q", got)
			}
			got, err := e.c.Get(ctxT(t), sb.ID)
			if err != nil || got.State != "running" || got.OOMKills != 0 {
				t.Fatalf("after filling /tmp: %+v, %v; want running, no OOM kills", got, err)
			}
			// /tmp keeps its files across stop and start, as the rest of the
			// rootfs does.
			if _, err := e.c.Stop(ctxT(t), sb.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := e.c.Start(ctxT(t), sb.ID); err != nil {
				t.Fatal(err)
			}
			if got := execOK(t, sb.ID, "cat", "/tmp/small"); got != "fits\n" {
				t.Errorf("/tmp/small after stop and start: %q", got)
			}
		})
	}
}

// TestShmFillNoKillSpree: memory held by files in a tmpfs (/dev/shm) takes
// the sandbox a little past its bound: the OOM guard must not kill every
// new command for memory no process holds (it used to, rm included: each
// new command went over and died). Commands run, and rm frees it.
func TestShmFillNoKillSpree(t *testing.T) {
	e := need(t)
	sb := create(t, client.CreateRequest{Image: busybox, Provider: "gvisor", Memory: jsonRaw("64MiB")})
	// Fill /dev/shm until the sandbox's memory (MemTotal-MemAvailable, in
	// KiB) is 2 MiB past its 64 MiB.
	res, err := e.c.Exec(ctxT(t), sb.ID, client.ExecRequest{Argv: []string{"sh", "-c", `
set -- $(grep -E '^(MemTotal|MemAvailable):' /proc/meminfo)
dd if=/dev/zero of=/dev/shm/x bs=1k count=$((65536 - ($2 - $5) + 2048)) 2>&1`}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("dd into /dev/shm: exit %d oom %v %q", res.ExitCode, res.OOM, res.Stdout)
	for i := 0; i < 5; i++ {
		if got := execOK(t, sb.ID, "sh", "-c", "grep -E '^(MemAvailable|Shmem):' /proc/meminfo >/dev/null && echo alive"); got != "alive\n" {
			t.Fatalf("command %d with /dev/shm full: %q", i, got)
		}
	}
	execOK(t, sb.ID, "rm", "-f", "/dev/shm/x")
	if got := execOK(t, sb.ID, "sh", "-c", "sleep 0 & wait; echo alive"); got != "alive\n" {
		t.Fatalf("after rm: %q", got)
	}
	got, err := e.c.Get(ctxT(t), sb.ID)
	if err != nil || got.State != "running" {
		t.Fatalf("after filling /dev/shm: %+v, %v; want running", got, err)
	}
}

// TestTmpAcrossFork: /tmp on disk travels with a fork like the rest of the
// rootfs (the fork gets its own copy), and a fork's /tmp is on disk too.
func TestTmpAcrossFork(t *testing.T) {
	e := need(t)
	sb := create(t, client.CreateRequest{Image: busybox, Provider: "gvisor"})
	execOK(t, sb.ID, "sh", "-c", "echo src > /tmp/from-src")
	f, err := e.c.Fork(ctxT(t), sb.ID, client.ForkRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.Remove(ctxT(t), f.ID, true) })
	if got := execOK(t, f.ID, "cat", "/tmp/from-src"); got != "src\n" {
		t.Errorf("the fork's /tmp/from-src: %q, want src", got)
	}
	if out := execOK(t, f.ID, "sh", "-c", "grep ' /tmp ' /proc/mounts || echo none"); out != "none\n" {
		t.Errorf("the fork's /tmp is a mount of its own: %q", out)
	}
	execOK(t, f.ID, "sh", "-c", "echo fork > /tmp/from-fork")
	if out := execOK(t, sb.ID, "sh", "-c", "ls /tmp"); out != "from-src\n" {
		t.Errorf("the source's /tmp after the fork wrote to its own: %q, want from-src alone", out)
	}
}
