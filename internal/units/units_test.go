package units

import (
	"math"
	"strconv"
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr string // a part of the message; "" for success
	}{
		{"512MiB", 512 << 20, ""},
		{"512Mi", 512 << 20, ""},
		{"512m", 512 << 20, ""},
		{"2GiB", 2 << 30, ""},
		{"1G", 1 << 30, ""},
		{"1GB", 1e9, ""},
		{"1024", 1024, ""},
		{"1.5GiB", 3 << 29, ""},
		{" 64 MiB ", 64 << 20, ""},
		{"1TiB", 1 << 40, ""},
		{"1PiB", 1 << 50, ""},
		{"1e3", 1000, ""},
		{"1.5e3KB", 1_500_000, ""},
		{".5KiB", 512, ""},
		{"0", 0, ""},
		{"9223372036854775807", math.MaxInt64, ""},
		{"8191PiB", 8191 << 50, ""},
		{"", 0, "empty size"},
		{"lots", 0, "not a size"},
		{"-1MiB", 0, "not a size"},
		{"+1MiB", 0, "not a size"},
		{"12XB", 0, "not a size"},
		{"NaN", 0, "not a size"},
		{"Inf", 0, "not a size"},
		{"0x10", 0, "not a size"},
		{"1/2GiB", 0, "not a size"},
		{"1e999", 0, "not a size"},
		{strings.Repeat("1", 100), 0, "not a size"},
		// Old code: these wrapped or were rounded without a word.
		{"9223372036854775808", 0, "too large"},
		{"8EiB", 0, "not a size"},
		{"8192PiB", 0, "too large"},
		{"16777216TiB", 0, "too large"},
		{"17592186044928MiB", 0, "too large"},
		// Not whole bytes: the suggestion is the nearest whole bytes in
		// the next unit below the one typed that holds it.
		{"0.3MiB", 0, `"0.3MiB" is not a whole number of bytes: use a size that is, like 307KiB`},
		{"0.3GiB", 0, "like 307MiB"},
		{"0.3g", 0, "like 307MiB"},
		{"1.0001TiB", 0, "like 1024GiB"},
		{"0.3KiB", 0, "like 307B"},
		{"1e-2KiB", 0, "like 10B"},
		{"1e-9KiB", 0, "like 1B"},
		{"1.0005KB", 0, "like 1001B"},
		{"0.0012345MB", 0, "like 1KB"},
		{"1.5", 0, "whole number of bytes: use a size that is, like 2"},
		{"1e-1", 0, "like 1"},
		{"2.5b", 0, "like 3B"},
	}
	for _, tt := range tests {
		got, err := ParseSize(tt.in)
		switch {
		case tt.wantErr == "" && (err != nil || got != tt.want):
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("ParseSize(%q) = %d, %v; want an error saying %q", tt.in, got, err, tt.wantErr)
		}
	}
}

func TestParseCPU(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr string
	}{
		{"1", 1000, ""}, {"0.5", 500, ""}, {"250m", 250, ""}, {"2", 2000, ""},
		{"0.001", 1, ""}, {"1m", 1, ""}, {"0.5000", 500, ""}, {"1.25", 1250, ""},
		{" 2 ", 2000, ""}, {"1e-3", 1, ""}, {"1000000", 1_000_000_000, ""},
		{"0", 0, "above zero"}, {"0m", 0, "above zero"}, {"x", 0, "not a cpu amount"},
		{"-1", 0, "not a cpu amount"}, {"m", 0, "not a cpu amount"}, {"-5m", 0, "not a cpu amount"},
		{"NaN", 0, "not a cpu amount"}, {"Inf", 0, "not a cpu amount"},
		// Old code: 0.0001 rounded to 0 (then the default, a whole cpu);
		// 0.0015 to 2m; 1.5m failed only by luck; huge amounts overflowed.
		{"0.0001", 0, "finer than"}, {"0.0015", 0, "finer than"}, {"1.5m", 0, "finer than"},
		{"1000001", 0, "too large"}, {"9223372036854775807m", 0, "too large"},
		{"99999999999999999999999", 0, "too large"},
	}
	for _, tt := range tests {
		got, err := ParseCPU(tt.in)
		switch {
		case tt.wantErr == "" && (err != nil || got != tt.want):
			t.Errorf("ParseCPU(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("ParseCPU(%q) = %d, %v; want an error saying %q", tt.in, got, err, tt.wantErr)
		}
	}
}

func TestFormatCPU(t *testing.T) {
	for _, tt := range []struct {
		in   int64
		want string
	}{{1000, "1"}, {500, "0.5"}, {1, "0.001"}, {1250, "1.25"}, {0, "0"}, {12000, "12"}} {
		if got := FormatCPU(tt.in); got != tt.want {
			t.Errorf("FormatCPU(%d) = %q, want %q", tt.in, got, tt.want)
		}
		if tt.in > 0 {
			if back, err := ParseCPU(FormatCPU(tt.in)); err != nil || back != tt.in {
				t.Errorf("ParseCPU(FormatCPU(%d)) = %d, %v", tt.in, back, err)
			}
		}
	}
}

// FuzzParseSize: nothing panics; what parses is a non-negative byte count
// that reads back the same as a bare number, and whose FormatSize reads
// back exactly when it is whole GiB or MiB, else within the rounding.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"512MiB", "1.5GiB", "0.3MiB", "1e3", "9223372036854775807", "17592186044928MiB", "8EiB", "-1", " 1 k", ".5", "1e-2KiB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseSize(s)
		if err != nil {
			if v != 0 {
				t.Fatalf("ParseSize(%q) = %d with error %v", s, v, err)
			}
			return
		}
		if v < 0 {
			t.Fatalf("ParseSize(%q) = %d, negative", s, v)
		}
		if back, err := ParseSize(strconv.FormatInt(v, 10)); err != nil || back != v {
			t.Fatalf("ParseSize(%d) = %d, %v", v, back, err)
		}
		if v == 0 {
			return
		}
		formatted := FormatSize(v)
		back, err := ParseSize(formatted)
		if v%(1<<20) == 0 || v < 1<<10 {
			if err != nil || back != v {
				t.Fatalf("ParseSize(FormatSize(%d) = %q) = %d, %v; want it exact", v, formatted, back, err)
			}
			return
		}
		// One decimal of the unit: off by at most 5% of a unit, and not a
		// whole number of bytes, maybe (then refused, which is fine).
		if err == nil && math.Abs(float64(back-v)) > 0.051*float64(v) {
			t.Fatalf("ParseSize(FormatSize(%d) = %q) = %d: too far", v, formatted, back)
		}
	})
}

// FuzzParseCPU: what parses is 1..MaxCPUMillis millicpus and round-trips
// through FormatCPU and through the "Nm" form.
func FuzzParseCPU(f *testing.F) {
	for _, s := range []string{"1", "0.5", "500m", "0.0001", "1e-3", "1000001", "0", "-1", "1.5m", "99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseCPU(s)
		if err != nil {
			if v != 0 {
				t.Fatalf("ParseCPU(%q) = %d with error %v", s, v, err)
			}
			return
		}
		if v < 1 || v > MaxCPUMillis {
			t.Fatalf("ParseCPU(%q) = %d, out of 1..%d", s, v, MaxCPUMillis)
		}
		for _, form := range []string{FormatCPU(v), strconv.FormatInt(v, 10) + "m"} {
			if back, err := ParseCPU(form); err != nil || back != v {
				t.Fatalf("ParseCPU(%q) = %d, %v; want %d (from %q)", form, back, err, v, s)
			}
		}
	})
}

func TestScale(t *testing.T) {
	for _, tt := range []struct {
		in   string
		mult int64
		want int64
		err  error
	}{
		{"1.5", 1000, 1500, nil}, {"2e3", 1, 2000, nil}, {".25", 4, 1, nil}, {"0", 7, 0, nil},
		{"0.0001", 1000, 0, ErrNotWhole}, {"-1", 1, 0, ErrNotNumber}, {"1e99", 1, 0, ErrTooLarge}, {"1e100", 1, 0, ErrNotNumber},
		{"9223372036854775807", 1, math.MaxInt64, nil}, {"9223372036854775807", 2, 0, ErrTooLarge},
		{"1/2", 2, 0, ErrNotNumber}, {"0x10", 1, 0, ErrNotNumber}, {"1e", 1, 0, ErrNotNumber},
	} {
		got, err := Scale(tt.in, tt.mult)
		if got != tt.want || err != tt.err {
			t.Errorf("Scale(%q, %d) = %d, %v; want %d, %v", tt.in, tt.mult, got, err, tt.want, tt.err)
		}
	}
}
