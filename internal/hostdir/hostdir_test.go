package hostdir

import (
	"os"
	"path/filepath"
	"testing"
)

func TestPrivate(t *testing.T) {
	base := t.TempDir()
	for _, tc := range []struct {
		name string
		prep func(string) error
	}{
		{"new", func(string) error { return nil }},
		{"existing 0711", func(p string) error { return os.Mkdir(p, 0o711) }},
		{"existing 0777", func(p string) error { return os.Mkdir(p, 0o777) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(base, tc.name, "sub")
			os.MkdirAll(filepath.Dir(p), 0o755)
			if err := tc.prep(p); err != nil {
				t.Fatal(err)
			}
			os.Chmod(p, 0o777) // undo the umask
			if tc.name == "new" {
				os.Remove(p)
			}
			if err := Private(p); err != nil {
				t.Fatal(err)
			}
			st, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if got := st.Mode().Perm(); got != 0o700 {
				t.Errorf("mode %v, want 0700", got)
			}
		})
	}
	f := filepath.Join(base, "file")
	os.WriteFile(f, nil, 0o644)
	if err := Private(f); err == nil {
		t.Error("a file is not a directory: want an error")
	}
}
