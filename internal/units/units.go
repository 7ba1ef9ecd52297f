// Package units parses the sizes and cpu amounts users type: "512MiB",
// "512Mi", "1G", "2GiB", "1.5", "500m".
//
// Parsing is exact: a number is read as a decimal (never through a float),
// a value that is not a whole number of bytes, or of millicpus, is refused
// rather than rounded, and a value too large for an int64 is refused rather
// than wrapped.
package units

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"regexp"
	"strings"
)

var sizeSuffix = []struct {
	s string
	m int64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40}, {"pib", 1 << 50},
	{"ki", 1 << 10}, {"mi", 1 << 20}, {"gi", 1 << 30}, {"ti", 1 << 40}, {"pi", 1 << 50},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12}, {"pb", 1e15},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40}, {"p", 1 << 50}, // docker's reading
	{"b", 1},
}

// MaxSize is the largest size ParseSize returns (an int64's largest value).
const MaxSize = math.MaxInt64

// MaxCPUMillis is the largest cpu amount ParseCPU returns: a million cpus,
// far above any host, low enough that no arithmetic on it overflows (a cpu
// quota is millis × 100 µs).
const MaxCPUMillis = 1_000_000_000

// maxNumber bounds the text of a number: longer is no size anyone means,
// and the exact arithmetic stays small.
const maxNumber = 64

// decimalRe is a plain decimal: digits with an optional fraction and an
// optional exponent of at most two digits. No sign, no hex, no "Inf".
var decimalRe = regexp.MustCompile(`^(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]{1,2})?$`)

// decimal reads s exactly, as a fraction.
func decimal(s string) (*big.Rat, bool) {
	if len(s) > maxNumber || !decimalRe.MatchString(s) {
		return nil, false
	}
	r, ok := new(big.Rat).SetString(s)
	return r, ok
}

// Why Scale refuses a number.
var (
	ErrNotNumber = errors.New("not a plain decimal number")
	ErrNotWhole  = errors.New("not a whole number of the unit")
	ErrTooLarge  = errors.New("too large")
)

// Scale reads the plain decimal s exactly ("1.5", "2e3", ".25"; no sign)
// and returns s × mult, which must be a whole number that fits an int64.
func Scale(s string, mult int64) (int64, error) {
	r, ok := decimal(s)
	if !ok {
		return 0, ErrNotNumber
	}
	r.Mul(r, new(big.Rat).SetInt64(mult))
	if !r.IsInt() {
		return 0, ErrNotWhole
	}
	if n := r.Num(); n.IsInt64() {
		return n.Int64(), nil
	}
	return 0, ErrTooLarge
}

// ParseSize reads a byte size. A bare number is bytes. It refuses a size
// that is not a whole number of bytes ("0.3MiB") and one above MaxSize.
func ParseSize(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	if t == "" {
		return 0, fmt.Errorf("empty size: use a number with a unit, like 512MiB or 2GiB")
	}
	mult, suffix := int64(1), ""
	for _, suf := range sizeSuffix {
		if strings.HasSuffix(t, suf.s) {
			mult, suffix = suf.m, suf.s
			t = strings.TrimSpace(strings.TrimSuffix(t, suf.s))
			break
		}
	}
	v, err := Scale(t, mult)
	switch err {
	case ErrNotNumber:
		return 0, fmt.Errorf("%q is not a size: use a number with a unit, like 512MiB or 2GiB", s)
	case ErrNotWhole:
		return 0, fmt.Errorf("%q is not a whole number of bytes: use a size that is, like %s", s, nearWhole(t, mult, suffix))
	case ErrTooLarge:
		return 0, fmt.Errorf("%q is too large a size: at most %d bytes (8EiB)", s, int64(MaxSize))
	}
	return v, nil
}

// nearWhole is the whole number of bytes nearest to the decimal number ×
// mult, written in the next unit below mult's (of its kind, binary or
// decimal) that leaves it above zero: "307KiB" for 0.3 MiB, "2" for 1.5
// bytes. The suffix typed ("" for none) names bytes as the user did.
func nearWhole(number string, mult int64, suffix string) string {
	r, _ := decimal(number)
	r.Mul(r, new(big.Rat).SetInt64(mult))
	units := binaryUnits
	if mult%1000 == 0 && mult%1024 != 0 {
		units = decimalUnits
	}
	for i := len(units) - 1; i >= 0; i-- {
		if units[i].m >= mult {
			continue
		}
		if v := roundRat(new(big.Rat).Quo(r, new(big.Rat).SetInt64(units[i].m))); v.Sign() > 0 {
			return v.String() + units[i].s
		}
	}
	v := roundRat(r)
	if v.Sign() == 0 {
		v.SetInt64(1)
	}
	if suffix == "" {
		return v.String()
	}
	return v.String() + "B"
}

// The units nearWhole suggests, smallest first.
var (
	binaryUnits = []struct {
		s string
		m int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}}
	decimalUnits = []struct {
		s string
		m int64
	}{{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}}
)

// roundRat is r rounded to the nearest integer, halves up (r >= 0).
func roundRat(r *big.Rat) *big.Int {
	n := new(big.Int).Mul(r.Num(), big.NewInt(2))
	n.Add(n, r.Denom())
	return n.Quo(n, new(big.Int).Mul(r.Denom(), big.NewInt(2)))
}

// ParseCPU reads a cpu amount in millicpus: "1" is 1000, "0.5" and "500m"
// 500. It refuses zero, an amount finer than a millicpu ("0.0001") and one
// above MaxCPUMillis.
func ParseCPU(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1000)
	if m, ok := strings.CutSuffix(t, "m"); ok {
		t, mult = m, 1
	}
	v, err := Scale(t, mult)
	switch {
	case err == ErrNotNumber:
		return 0, fmt.Errorf("%q is not a cpu amount: use e.g. 1, 0.5 or 500m", s)
	case err == ErrNotWhole:
		return 0, fmt.Errorf("%q is finer than a cpu is divided: use whole thousandths of a cpu, e.g. 0.001 or 1m", s)
	case err == ErrTooLarge || v > MaxCPUMillis:
		return 0, fmt.Errorf("%q is too large a cpu amount: at most %d cpus", s, MaxCPUMillis/1000)
	case v <= 0:
		return 0, fmt.Errorf("%q is not a cpu amount: it must be above zero, e.g. 1, 0.5 or 500m", s)
	}
	return v, nil
}

// FormatCPU prints millicpus the way ParseCPU reads them back: "1", "0.5",
// "0.001".
func FormatCPU(millis int64) string {
	if millis < 0 {
		return fmt.Sprintf("%dm", millis)
	}
	s := strings.TrimRight(fmt.Sprintf("%d.%03d", millis/1000, millis%1000), "0")
	return strings.TrimSuffix(s, ".")
}

// FormatSize prints bytes the way ParseSize reads them back: exactly when
// the size is a whole number of PiB, TiB, GiB or MiB (or below a KiB), else
// rounded to one decimal.
func FormatSize(n int64) string {
	switch {
	case n >= 1<<50 && n%(1<<50) == 0:
		return fmt.Sprintf("%dPiB", n>>50)
	case n >= 1<<40 && n%(1<<40) == 0:
		return fmt.Sprintf("%dTiB", n>>40)
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
