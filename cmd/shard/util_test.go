package main

import "testing"

func TestHumanSize(t *testing.T) {
	for _, tc := range []struct {
		n    int64
		want string
	}{
		{0, "0B"},
		{1023, "1023B"},
		{1024, "1KiB"},
		{1536, "1.5KiB"},
		{12345, "12KiB"},
		{3 << 20, "3MiB"},
		{128974848, "123MiB"},
		{1023 << 20, "1023MiB"},
		{1450 << 20, "1.4GiB"},
		{10 << 30, "10GiB"},
		{5 << 40, "5TiB"},
		{3 << 50, "3PiB"},
		{1 << 62, "4096PiB"},
	} {
		if got := humanSize(tc.n); got != tc.want {
			t.Errorf("humanSize(%d) = %s, want %s", tc.n, got, tc.want)
		}
	}
}
