package units

import "testing"

func TestParseSize(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr bool
	}{
		{"512MiB", 512 << 20, false},
		{"512Mi", 512 << 20, false},
		{"512m", 512 << 20, false},
		{"2GiB", 2 << 30, false},
		{"1G", 1 << 30, false},
		{"1GB", 1e9, false},
		{"1024", 1024, false},
		{"1.5GiB", 3 << 29, false},
		{"", 0, true},
		{"lots", 0, true},
		{"-1MiB", 0, true},
		{"12XB", 0, true},
	}
	for _, tt := range tests {
		got, err := ParseSize(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d, err=%v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestParseCPU(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr bool
	}{
		{"1", 1000, false}, {"0.5", 500, false}, {"250m", 250, false}, {"2", 2000, false},
		{"0", 0, true}, {"x", 0, true}, {"-1", 0, true}, {"m", 0, true},
	}
	for _, tt := range tests {
		got, err := ParseCPU(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseCPU(%q) = %d, %v; want %d, err=%v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}
