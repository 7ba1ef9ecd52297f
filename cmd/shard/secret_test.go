package main

import (
	"errors"
	"strings"
	"testing"
	"testing/iotest"
)

func TestReadSecret(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		want    string
		wantErr string
	}{
		{name: "as it is", in: "hunter2", want: "hunter2"},
		{name: "newline kept", in: "hunter2\n", want: "hunter2\n"},
		{name: "binary", in: "\x00\xff\n\r", want: "\x00\xff\n\r"},
		{name: "empty", in: "", wantErr: "the value is empty"},
		{name: "at the limit", in: strings.Repeat("x", maxSecretInput), want: strings.Repeat("x", maxSecretInput)},
		{name: "over the limit", in: strings.Repeat("x", maxSecretInput+1), wantErr: "larger than"},
	} {
		got, err := readSecret(strings.NewReader(tc.in))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: err = %v, want one containing %q", tc.name, err, tc.wantErr)
			}
			continue
		}
		if err != nil || string(got) != tc.want {
			t.Errorf("%s: readSecret = %q (%d bytes), %v; want %d bytes", tc.name, truncate(got), len(got), err, len(tc.want))
		}
	}
	boom := errors.New("boom")
	if _, err := readSecret(iotest.ErrReader(boom)); !errors.Is(err, boom) {
		t.Errorf("a failing reader: err = %v, want boom", err)
	}
}

func truncate(b []byte) []byte {
	if len(b) > 20 {
		return b[:20]
	}
	return b
}
