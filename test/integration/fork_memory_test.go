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
// fork).
func TestForkMemoryConsistent(t *testing.T) {
	e := need(t)
	src := create(t, client.CreateRequest{Image: python, Memory: jsonRaw("768MiB")})
	execOK(t, src.ID, "sh", "-c", "cat > /tmp/w.py <<'EOF'\n"+writerScript+"\nEOF\npython3 /tmp/w.py >/tmp/w.log 2>&1 &")
	deadline := time.Now().Add(2 * time.Minute)
	for passOf(t, src.ID) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the writer did not finish two passes: %s", execOK(t, src.ID, "sh", "-c", "cat /tmp/w.log"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	forks, err := e.c.ForkMany(ctxT(t), src.ID, client.ForkRequest{Count: 2})
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

	all := map[string]string{"source": src.ID, "fork 1": forks[0].ID, "fork 2": forks[1].ID, "fork of fork 1": ff.ID}
	start := map[string]int{}
	for who, id := range all {
		start[who] = passOf(t, id)
	}
	// Two more whole passes each: every page written again, checked first.
	for who, id := range all {
		for passOf(t, id) < start[who]+2 {
			if time.Now().After(deadline.Add(2 * time.Minute)) {
				t.Fatalf("%s: the writer stopped at pass %d", who, passOf(t, id))
			}
			time.Sleep(200 * time.Millisecond)
		}
		if torn := execOK(t, id, "sh", "-c", "cat /tmp/torn 2>/dev/null; cat /tmp/w.log"); torn != "" {
			t.Errorf("%s: pages not from one instant:\n%s", who, firstLines(torn, 10))
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
