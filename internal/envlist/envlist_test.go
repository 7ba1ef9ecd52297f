package envlist

import (
	"slices"
	"testing"
)

func TestMergeEnv(t *testing.T) {
	tests := []struct {
		name        string
		base, extra []string
		want        []string
	}{
		{"both empty", nil, nil, nil},
		{"base only", []string{"A=1", "B=2"}, nil, []string{"A=1", "B=2"}},
		{"extra only", nil, []string{"A=1"}, []string{"A=1"}},
		{"override keeps position", []string{"A=1", "B=2", "C=3"}, []string{"B=x"}, []string{"A=1", "B=x", "C=3"}},
		{"add at the end", []string{"A=1"}, []string{"Z=9", "B=2"}, []string{"A=1", "Z=9", "B=2"}},
		{"last extra wins", []string{"A=1"}, []string{"A=2", "A=3"}, []string{"A=3"}},
		{"duplicate in base collapses", []string{"A=1", "B=2", "A=3"}, nil, []string{"A=3", "B=2"}},
		{"empty value overrides", []string{"A=1"}, []string{"A="}, []string{"A="}},
		{"value with =", []string{"A=1"}, []string{"A=b=c"}, []string{"A=b=c"}},
		{"key is case sensitive", []string{"path=/a"}, []string{"PATH=/b"}, []string{"path=/a", "PATH=/b"}},
		{"prefix is not the key", []string{"AB=1"}, []string{"A=2"}, []string{"AB=1", "A=2"}},
	}
	for _, tt := range tests {
		base := slices.Clone(tt.base)
		got := Merge(tt.base, tt.extra)
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: Merge(%q, %q) = %q, want %q", tt.name, tt.base, tt.extra, got, tt.want)
		}
		if !slices.Equal(tt.base, base) {
			t.Errorf("%s: Merge(%q, %q) modified base to %q", tt.name, base, tt.extra, tt.base)
		}
	}
}

// Merge must not write into base's spare capacity (the append trap).
func TestMergeEnvDoesNotAlias(t *testing.T) {
	base := make([]string, 1, 10)
	base[0] = "A=1"
	got := Merge(base, []string{"B=2"})
	got[0] = "A=changed"
	if base[0] != "A=1" {
		t.Errorf("Merge result aliases base: base[0] = %q after changing the result, want %q", base[0], "A=1")
	}
	if extra := base[:2]; extra[1] != "" {
		t.Errorf("Merge wrote %q into base's spare capacity, want it untouched", extra[1])
	}
}

func TestEnvValue(t *testing.T) {
	tests := []struct {
		env  []string
		key  string
		want string
	}{
		{nil, "PATH", ""},
		{[]string{"PATH=/bin"}, "PATH", "/bin"},
		{[]string{"PATH=/a", "PATH=/b"}, "PATH", "/b"}, // the last one, as Merge would
		{[]string{"PATHX=/a"}, "PATH", ""},
		{[]string{"XPATH=/a"}, "PATH", ""},
		{[]string{"PATH"}, "PATH", ""}, // no "=": not a value
		{[]string{"PATH="}, "PATH", ""},
		{[]string{"A=b=c"}, "A", "b=c"},
		{[]string{"path=/a"}, "PATH", ""},
	}
	for _, tt := range tests {
		if got := Value(tt.env, tt.key); got != tt.want {
			t.Errorf("Value(%q, %q) = %q, want %q", tt.env, tt.key, got, tt.want)
		}
	}
}

func TestHasKey(t *testing.T) {
	tests := []struct {
		env  []string
		key  string
		want bool
	}{
		{nil, "HOME", false},
		{[]string{"HOME=/root"}, "HOME", true},
		{[]string{"HOME="}, "HOME", true},
		{[]string{"HOMEDIR=/x"}, "HOME", false},
		{[]string{"A=1", "HOME=/x"}, "HOME", true},
		{[]string{"home=/x"}, "HOME", false},
	}
	for _, tt := range tests {
		if got := Has(tt.env, tt.key); got != tt.want {
			t.Errorf("Has(%q, %q) = %v, want %v", tt.env, tt.key, got, tt.want)
		}
	}
}
