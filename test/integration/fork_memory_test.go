package integration

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/client"
)

// writerScript rewrites a generation number into every page of 64 MiB, in
// page order, pass after pass, and before each write checks that the page
// holds the previous pass's number. Its own position (pass and page) lives
// in the same memory: a fork whose memory is not the source's at one
// instant (a page copied before or after the others) breaks that check at
// the page's next write, and the writer reports it in /tmp/torn. /tmp/pass
// is the last finished pass.
const writerScript = `
import os, struct
P = 4096
N = (64 << 20) // P
buf = bytearray(os.urandom(N * P))
for i in range(N):
    struct.pack_into('<Q', buf, i * P, 0)
g = 0
while True:
    g += 1
    for i in range(N):
        cur = struct.unpack_from('<Q', buf, i * P)[0]
        if cur != g - 1:
            with open('/tmp/torn', 'a') as f:
                f.write('pass %d page %d holds %d\n' % (g, i, cur))
        struct.pack_into('<Q', buf, i * P, g)
    with open('/tmp/pass.tmp', 'w') as f:
        f.write(str(g))
    os.rename('/tmp/pass.tmp', '/tmp/pass')
`

func passOf(t *testing.T, id string) int {
	t.Helper()
	out := execOK(t, id, "sh", "-c", "cat /tmp/pass 2>/dev/null || echo 0")
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("pass %q: %v", out, err)
	}
	return n
}

// TestForkMemoryConsistent: a process that keeps writing over 64 MiB while
// it is forked finds, in each fork and in the source, every page from one
// instant, and keeps going (--count 2 from one freeze, then a fork of a
// fork): with the memory handed over (which the checkpoints must record),
// then with the server restarted with --fork-memory pages.
func TestForkMemoryConsistent(t *testing.T) {
	need(t)
	src := create(t, client.CreateRequest{Image: python, Memory: jsonRaw("768MiB")})
	execOK(t, src.ID, "sh", "-c", "cat > /tmp/w.py <<'EOF'\n"+writerScript+"\nEOF\npython3 /tmp/w.py >/tmp/w.log 2>&1 &")
	deadline := time.Now().Add(2 * time.Minute)
	for passOf(t, src.ID) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the writer did not finish two passes: %s", execOK(t, src.ID, "sh", "-c", "cat /tmp/w.log"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	checkForksConsistent(t, src.ID, "handoff")

	restartWith(t, "--fork-memory", "pages")
	checkForksConsistent(t, src.ID, "pages")
}

// checkForksConsistent forks src twice from one freeze, then the first
// fork, and checks that the writer runs on in all of them (and in src)
// with every page from one instant; src's checkpoints must say memory.
func checkForksConsistent(t *testing.T, src, memory string) {
	t.Helper()
	e := need(t)
	forks, err := e.c.ForkMany(ctxT(t), src, client.ForkRequest{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range forks {
		t.Cleanup(func() { e.c.Remove(context.Background(), f.ID, true) })
	}
	ff, err := e.c.Fork(ctxT(t), forks[0].ID, client.ForkRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.Remove(context.Background(), ff.ID, true) })
	for _, id := range []string{src, forks[0].ID} {
		cks, err := e.c.Checkpoints(ctxT(t), id)
		if err != nil || len(cks) == 0 {
			t.Fatalf("checkpoints of %s: %v %v", id, cks, err)
		}
		if ck := cks[len(cks)-1]; ck.Memory != memory {
			t.Errorf("the fork's checkpoint %s took memory %q (%s), want %q", ck.ID, ck.Memory, ck.MemoryNote, memory)
		}
	}

	all := map[string]string{"source": src, "fork 1": forks[0].ID, "fork 2": forks[1].ID, "fork of fork 1": ff.ID}
	start := map[string]int{}
	for who, id := range all {
		start[who] = passOf(t, id)
	}
	// Two more whole passes each: every page written again, checked first.
	deadline := time.Now().Add(3 * time.Minute)
	for who, id := range all {
		for passOf(t, id) < start[who]+2 {
			if time.Now().After(deadline) {
				t.Fatalf("%s (%s): the writer stopped at pass %d", who, memory, passOf(t, id))
			}
			time.Sleep(200 * time.Millisecond)
		}
		if torn := execOK(t, id, "sh", "-c", "cat /tmp/torn 2>/dev/null; cat /tmp/w.log"); torn != "" {
			t.Errorf("%s (%s): pages not from one instant:\n%s", who, memory, firstLines(torn, 10))
		}
	}
	// Each fork's host memory cgroup holds its memory (the writer's 64 MiB
	// at least, every page of it written twice since), however the memory
	// reached it.
	for _, id := range []string{forks[0].ID, forks[1].ID, ff.ID} {
		usage := readTrim(t, "/sys/fs/cgroup/memory/shard/"+id+"/memory.usage_in_bytes")
		if n, err := strconv.ParseInt(usage, 10, 64); err != nil || n < 64<<20 {
			t.Errorf("fork %s (%s): its memory cgroup holds %s bytes, want its memory (64 MiB and more)", id, memory, usage)
		}
	}
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}
