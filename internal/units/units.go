// Package units parses the sizes and cpu amounts users type: "512MiB",
// "512Mi", "1G", "2GiB", "1.5", "500m".
package units

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

var sizeSuffix = []struct {
	s string
	m float64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"ki", 1 << 10}, {"mi", 1 << 20}, {"gi", 1 << 30}, {"ti", 1 << 40},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40}, // docker's reading
	{"b", 1},
}

// ParseSize reads a byte size. A bare number is bytes.
func ParseSize(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	if t == "" {
		return 0, fmt.Errorf("empty size")
	}
	mult := 1.0
	for _, suf := range sizeSuffix {
		if strings.HasSuffix(t, suf.s) {
			mult = suf.m
			t = strings.TrimSpace(strings.TrimSuffix(t, suf.s))
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) || f*mult > math.MaxInt64/2 {
		return 0, fmt.Errorf("%q is not a size: use a number with a unit, like 512MiB or 2GiB", s)
	}
	return int64(f * mult), nil
}

// ParseCPU reads a cpu amount in millicpus: "1" is 1000, "0.5" and "500m" 500.
func ParseCPU(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if strings.HasSuffix(t, "m") {
		n, err := strconv.ParseInt(strings.TrimSuffix(t, "m"), 10, 64)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("%q is not a cpu amount: use e.g. 1, 0.5 or 500m", s)
		}
		return n, nil
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f <= 0 || f > 1024 || math.IsNaN(f) {
		return 0, fmt.Errorf("%q is not a cpu amount: use e.g. 1, 0.5 or 500m", s)
	}
	return int64(math.Round(f * 1000)), nil
}

// FormatSize prints bytes the way ParseSize reads them back.
func FormatSize(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<30:
		return fmt.Sprintf("%.1fGiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1fKiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}
