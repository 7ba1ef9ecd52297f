package hostdisk

import (
	"strings"
	"testing"

	"github.com/useshards/shard/internal/errdefs"
)

func fixed(avail, total uint64) func(string) (Space, error) {
	return func(string) (Space, error) { return Space{Avail: avail, Total: total}, nil }
}

// Take promises bytes against what is free less the reserve, and holds
// them until released; a refusal is a 507 naming the reserve's flag.
func TestTake(t *testing.T) {
	const gib = 1 << 30
	b := New("/data", 2*gib).WithStatfs(fixed(5*gib, 100*gib))
	r1, err := b.Take(2*gib, "one")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Take(2*gib, "two"); err == nil {
		t.Fatal("a second 2GiB of 5GiB free with 2GiB kept was taken")
	} else if errdefs.CodeOf(err) != "insufficient_storage" || !strings.Contains(err.Error(), "--reserve") || strings.Contains(err.Error(), "/data") {
		t.Fatalf("refusal %q: want insufficient_storage naming --reserve and not the host's path", err)
	}
	if err := b.Check("a layer"); err != nil {
		t.Fatalf("check with 3GiB free after promises: %v", err)
	}
	r1()
	r1() // twice is once
	if st, _ := b.State(); st.Pending != 0 || st.Spendable() != 3*gib {
		t.Fatalf("after release: %+v", st)
	}
	if _, err := b.Take(3*gib, "three"); err != nil {
		t.Fatalf("3GiB after the release: %v", err)
	}
	if _, err := b.Take(1, "one more byte"); err == nil {
		t.Fatal("a byte past the spendable was taken")
	}
	b.WithStatfs(fixed(5*gib-1, 100*gib))
	if err := b.Check("a layer"); err == nil {
		t.Fatal("check passed with the reserve less a byte left")
	}
}

func TestReserveDefaults(t *testing.T) {
	for _, tt := range []struct {
		give, want int64
	}{{0, DefaultReserve}, {-1, 0}, {5 << 30, 5 << 30}} {
		if got := New("/d", tt.give).Reserve(); got != tt.want {
			t.Errorf("New(%d).Reserve() = %d, want %d", tt.give, got, tt.want)
		}
	}
}

func TestCheckInodes(t *testing.T) {
	b := New("/d", 1).WithStatfs(func(string) (Space, error) {
		return Space{Avail: 1 << 40, Total: 1 << 41, Files: 1000, Ffree: 10}, nil
	})
	if err := b.Check("x"); err == nil || !strings.Contains(err.Error(), "inodes") {
		t.Fatalf("check with 1%% inodes free: %v", err)
	}
}
