package fsdiff

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// sparse makes the file rel under root of size bytes, holes but for data
// written at the offsets given.
func sparse(t *testing.T, root, rel string, size int64, data map[int64][]byte) {
	t.Helper()
	p := filepath.Join(root, rel)
	os.MkdirAll(filepath.Dir(p), 0o755)
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for off, b := range data {
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDiffSparse: files compared by their data maps: holes against holes
// are never read (two files of a TiB of holes each, under a read bound of
// one byte, are the same), written zeros are the same as holes, and a
// byte that differs is found wherever it is; what a comparison reads is
// only data.
func TestDiffSparse(t *testing.T) {
	const tib = 1 << 40
	zeros := make([]byte, 64<<10)
	for _, tc := range []struct {
		name    string
		a, b    map[int64][]byte
		maxRead int64
		want    string // the change of /big: "" none, else What, or "?" for not compared
	}{
		{"holes both", nil, nil, 1, ""},
		{"the same data at the same place", map[int64][]byte{tib / 2: []byte("x")}, map[int64][]byte{tib / 2: []byte("x")}, 1 << 20, ""},
		{"written zeros and holes", nil, map[int64][]byte{1 << 20: zeros, tib / 2: zeros}, 1 << 20, ""},
		{"zeros written in different places", map[int64][]byte{0: zeros}, map[int64][]byte{tib - 1<<20: zeros}, 1 << 20, ""},
		{"a byte in a hole of the other", nil, map[int64][]byte{tib / 2: []byte("x")}, 1 << 20, "content"},
		{"a byte past written zeros", map[int64][]byte{0: zeros}, map[int64][]byte{0: zeros, tib - 1: []byte("x")}, 1 << 20, "content"},
		{"data that differs", map[int64][]byte{4096: []byte("a")}, map[int64][]byte{4096: []byte("b")}, 1 << 20, "content"},
		{"data past the bound", map[int64][]byte{4096: []byte("a")}, map[int64][]byte{4096: []byte("b")}, 1, "?"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lower, a, b := t.TempDir(), t.TempDir(), t.TempDir()
			sparse(t, a, "big", tib, tc.a)
			sparse(t, b, "big", tib, tc.b)
			res, err := Diff(t.Context(), Tree{Upper: a}, Tree{Upper: b}, []string{lower}, Options{MaxRead: tc.maxRead})
			if err != nil {
				t.Fatal(err)
			}
			got := ""
			for _, c := range res.Changes {
				switch {
				case c.Path != "/big":
					t.Errorf("a change of %s", c.Path)
				case len(c.NotCompared) > 0:
					got = "?"
				default:
					got = strings.Join(c.What, ",")
				}
			}
			if got != tc.want {
				t.Errorf("/big: %q, want %q (%+v)", got, tc.want, res.Changes)
			}
		})
	}
}

// TestDiffReadBound: past Options.MaxRead a file whose content is not
// told apart yet is listed, as not compared, with what else is known of
// it; a file whose size differs is told apart without a read, bound or
// not; a patch is left out past the bound; the counts say so.
func TestDiffReadBound(t *testing.T) {
	lower, a, b := t.TempDir(), t.TempDir(), t.TempDir()
	body := strings.Repeat("line\n", 100<<10/5) // 100 KiB
	write(t, a, "1same", body)
	write(t, b, "1same", body)
	write(t, a, "2differs", body+"a")
	write(t, b, "2differs", body+"b")
	write(t, a, "3mode", body+"a")
	write(t, b, "3mode", body+"b")
	os.Chmod(filepath.Join(b, "3mode"), 0o600)
	write(t, a, "4size", "short\n")
	write(t, b, "4size", "longer\n")
	// 1same takes 200 KiB of a bound of 300: 2differs does not fit.
	res, err := Diff(t.Context(), Tree{Upper: a}, Tree{Upper: b}, []string{lower}, Options{MaxRead: 300 << 10, Patch: true})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range res.Changes {
		got = append(got, c.Path+" "+strings.Join(c.What, ",")+" ?"+strings.Join(c.NotCompared, ","))
		if len(c.NotCompared) > 0 && !strings.HasPrefix(c.Patch, "(diff left out") {
			t.Errorf("%s: a patch of a file not compared: %q", c.Path, c.Patch)
		}
	}
	want := []string{"/2differs  ?content", "/3mode mode ?content", "/4size content ?"}
	if !slices.Equal(got, want) {
		t.Errorf("changes\n%q\nwant\n%q", got, want)
	}
	if res.Changed != 3 || res.NotCompared != 2 {
		t.Errorf("changed %d, not compared %d; want 3 and 2", res.Changed, res.NotCompared)
	}
	if p := res.Changes[2].Patch; !strings.Contains(p, "-short\n+longer\n") {
		t.Errorf("the patch of /4size: %q", p)
	}
	// JSON says it.
	j, _ := json.Marshal(res.Changes[0])
	if !strings.Contains(string(j), `"not_compared":["content"]`) {
		t.Errorf("JSON: %s", j)
	}
	// With the default bound all is compared.
	all, err := Diff(t.Context(), Tree{Upper: a}, Tree{Upper: b}, []string{lower}, Options{})
	if err != nil || all.NotCompared != 0 || len(all.Changes) != 3 || strings.Join(all.Changes[1].What, ",") != "content,mode" {
		t.Errorf("default bound: %v %+v", err, all)
	}
}

// countdown is a context that ends after its Err has said nil n times: a
// diff cut at each of its checks in turn.
type countdown struct {
	context.Context
	n atomic.Int64
}

func (c *countdown) Err() error {
	if c.n.Add(-1) < 0 {
		return context.Canceled
	}
	return nil
}

func (c *countdown) Done() <-chan struct{} { return nil }

// TestDiffCancelled: a diff whose context ends returns the context's
// error, wherever it was (the walk, a comparison's reads of data, a patch),
// and never a partial result; one whose context does not end returns the
// whole result.
func TestDiffCancelled(t *testing.T) {
	lower, a, b := t.TempDir(), t.TempDir(), t.TempDir()
	write(t, lower, "etc/keep", "image\n")
	write(t, a, "etc/conf", "1\n")
	write(t, b, "etc/conf", "2\n")
	write(t, b, "new/dir/file", "x\n")
	big := strings.Repeat("x", 2<<20)
	write(t, a, "data", big+"a") // read in chunks: checks between them
	write(t, b, "data", big+"b")
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if res, err := Diff(ctx, Tree{Upper: a}, Tree{Upper: b}, []string{lower}, Options{Patch: true}); !errors.Is(err, context.Canceled) || res != nil {
		t.Fatalf("a cancelled diff: %v, %+v", err, res)
	}
	whole, err := Diff(t.Context(), Tree{Upper: a}, Tree{Upper: b}, []string{lower}, Options{Patch: true})
	if err != nil || len(whole.Changes) != 5 {
		t.Fatalf("the whole diff: %v %+v", err, whole)
	}
	for n := int64(0); ; n++ {
		c := &countdown{Context: t.Context()}
		c.n.Store(n)
		res, err := Diff(c, Tree{Upper: a}, Tree{Upper: b}, []string{lower}, Options{Patch: true})
		if err == nil {
			if len(res.Changes) != len(whole.Changes) {
				t.Fatalf("after %d checks: %d changes, want %d", n, len(res.Changes), len(whole.Changes))
			}
			if n < 10 {
				t.Errorf("the whole diff checked its context only %d times", n)
			}
			break
		}
		if !errors.Is(err, context.Canceled) || res != nil {
			t.Fatalf("cut after %d checks: %v, %+v", n, err, res)
		}
	}
}

// TestSameContentCancelled: a comparison of two big sparse files that
// differ only in their data maps (one of written zeros, one of holes)
// reads the written data, and stops at its context's end.
func TestSameContentCancelled(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	sparse(t, a, "big", 64<<20, map[int64][]byte{0: make([]byte, 32<<20)})
	sparse(t, b, "big", 64<<20, nil)
	ea, eb := entryOf(t, filepath.Join(a, "big")), entryOf(t, filepath.Join(b, "big"))
	d := &differ{ctx: t.Context(), o: Options{MaxRead: DefaultMaxRead}}
	if same, err := d.sameContent(ea, eb, nil, nil); !same || err != nil || d.read != 32<<20 {
		t.Fatalf("written zeros and holes: same %v, %v, %d bytes read; want the same, 32 MiB read", same, err, d.read)
	}
	ctx, cancel := context.WithCancel(t.Context())
	d = &differ{ctx: ctx, o: Options{MaxRead: DefaultMaxRead}}
	cancel()
	if same, err := d.sameContent(ea, eb, nil, nil); same || !errors.Is(err, context.Canceled) || d.read != 0 {
		t.Fatalf("cancelled: same %v, %v, %d bytes read", same, err, d.read)
	}
}

func entryOf(t *testing.T, p string) *entry {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return &entry{fi: fi, path: p, where: "upper"}
}

// TestWritten: a file the server writes is left out while each side holds
// what the server wrote, and listed when a side holds anything else, has
// none where it should, or its mode changed.
func TestWritten(t *testing.T) {
	server := func(data []byte, present bool) bool { return present && string(data) == "server\n" }
	for _, tc := range []struct {
		name   string
		b      func(t *testing.T, dir string)
		listed bool
	}{
		{"the server's", func(t *testing.T, dir string) { write(t, dir, "run/fork", "server\n") }, false},
		{"the sandbox's", func(t *testing.T, dir string) { write(t, dir, "run/fork", "mine\n") }, true},
		{"removed", func(t *testing.T, dir string) {
			os.MkdirAll(filepath.Join(dir, "run"), 0o755)
		}, true},
		{"a directory", func(t *testing.T, dir string) { os.MkdirAll(filepath.Join(dir, "run/fork"), 0o755) }, true},
		{"its mode", func(t *testing.T, dir string) {
			write(t, dir, "run/fork", "server\n")
			os.Chmod(filepath.Join(dir, "run/fork"), 0o666)
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lower, a, b := t.TempDir(), t.TempDir(), t.TempDir()
			write(t, a, "run/fork", "server\n")
			tc.b(t, b)
			// Two uppers of one lineage: the same inode would hide the
			// content; these are apart.
			res, err := Diff(t.Context(), Tree{Upper: a}, Tree{Upper: b}, []string{lower}, Options{
				Skip: []Skip{{Path: "/run", Type: "dir"}}, Written: []Written{{Path: "/run/fork", A: server, B: server}}})
			if err != nil {
				t.Fatal(err)
			}
			listed := slices.ContainsFunc(res.Changes, func(c Change) bool { return c.Path == "/run/fork" })
			if listed != tc.listed {
				t.Errorf("/run/fork listed %v, want %v: %+v", listed, tc.listed, res.Changes)
			}
		})
	}
	// Against an image without it (A nil: whatever it holds).
	lower, empty, b := t.TempDir(), t.TempDir(), t.TempDir()
	write(t, b, "run/fork", "server\n")
	res, err := Diff(t.Context(), Tree{Upper: empty}, Tree{Upper: b}, []string{lower}, Options{
		Skip: []Skip{{Path: "/run", Type: "dir"}}, Written: []Written{{Path: "/run/fork", B: server}}})
	if err != nil || len(res.Changes) != 0 {
		t.Errorf("against the image: %v %+v", err, res)
	}
}

// TestPathBytes: a name that is not UTF-8 keeps its bytes in path_bytes.
func TestPathBytes(t *testing.T) {
	lower, a, b := t.TempDir(), t.TempDir(), t.TempDir()
	write(t, b, "caf\xe9", "latin-1\n")
	write(t, b, "café", "utf-8\n")
	res, err := Diff(t.Context(), Tree{Upper: a}, Tree{Upper: b}, []string{lower}, Options{})
	if err != nil || len(res.Changes) != 2 {
		t.Fatalf("%v %+v", err, res)
	}
	j, _ := json.Marshal(res.Changes)
	var back []Change
	json.Unmarshal(j, &back)
	// In path order, bytes: "caf\xc3\xa9" first.
	if back[0].PathBytes != nil || string(back[1].PathBytes) != "/caf\xe9" {
		t.Errorf("path_bytes: %q, %q (JSON %s)", back[0].PathBytes, back[1].PathBytes, j)
	}
}

// TestDiffEntriesBound: a diff reads at most Options.MaxEntries directory
// entries (a sandbox makes millions in a few MiB, each costing the server
// memory while its directory is compared): past it the diff stops,
// truncated, with what it listed before; within it, all is compared.
func TestDiffEntriesBound(t *testing.T) {
	lower, a, b := t.TempDir(), t.TempDir(), t.TempDir()
	for i := range 3000 {
		name := fmt.Sprintf("many/f%04d", i)
		write(t, a, name, "same\n")
		write(t, b, name, "same\n")
	}
	write(t, b, "added", "x\n") // before many/ in path order
	for _, tc := range []struct {
		name       string
		maxEntries int
		truncated  bool
	}{
		{"within", 6010, false},
		{"past it in one directory", 4000, true},
		{"past it at once", 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Diff(t.Context(), Tree{Upper: a}, Tree{Upper: b}, []string{lower}, Options{MaxEntries: tc.maxEntries})
			if err != nil {
				t.Fatal(err)
			}
			if res.Truncated != tc.truncated {
				t.Errorf("truncated %v, want %v", res.Truncated, tc.truncated)
			}
			var got []string
			for _, c := range res.Changes {
				got = append(got, c.Kind+" "+c.Path)
			}
			want := []string{"added /added"}
			if tc.maxEntries == 1 {
				want = nil
			}
			if !slices.Equal(got, want) {
				t.Errorf("changes %q, want %q", got, want)
			}
		})
	}
}

// TestDiffPathTooLong: a path the host cannot look up (longer than
// PATH_MAX with the directory of its side; a sandbox makes it by relative
// paths) is not taken for absent: the diff says it is not complete, and
// lists the rest, the path's directories that it reaches included.
func TestDiffPathTooLong(t *testing.T) {
	lower, a, b := t.TempDir(), t.TempDir(), t.TempDir()
	root, err := os.OpenRoot(b)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	seg := strings.Repeat("d", 200)
	rel := "deep"
	for {
		if err := root.Mkdir(rel, 0o755); err != nil {
			t.Fatal(err)
		}
		if len(b)+len(rel) > unix.PathMax+200 {
			break
		}
		rel += "/" + seg
	}
	f, err := root.Create(rel + "/hidden")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	write(t, b, "z-after", "x\n")
	res, err := Diff(t.Context(), Tree{Upper: a}, Tree{Upper: b}, []string{lower}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Truncated {
		t.Errorf("a diff that left out %d bytes of path under %s is not truncated", len(rel), b)
	}
	var dirs int
	for _, c := range res.Changes {
		if strings.HasSuffix(c.Path, "/hidden") {
			t.Errorf("listed %s, which the host cannot reach", c.Path)
		}
		if len(b)+len(c.Path) >= unix.PathMax {
			t.Errorf("listed a path of %d bytes under %s", len(c.Path), b)
		}
		if strings.HasPrefix(c.Path, "/deep") {
			dirs++
		}
	}
	if dirs < 10 || res.Changes[len(res.Changes)-1].Path != "/z-after" {
		t.Errorf("%d of the path's directories listed, last %+v: want those reached, and what follows", dirs, res.Changes[len(res.Changes)-1])
	}
}
