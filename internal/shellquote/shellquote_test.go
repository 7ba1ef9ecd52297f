package shellquote

import "testing"

func TestJoin(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		want string
	}{
		{[]string{"pip", "install", "requests"}, "pip install requests"},
		{[]string{"python3", "-c", "print(1+1)"}, "python3 -c 'print(1+1)'"},
		{[]string{"sh", "-c", "echo oops; exit 2"}, "sh -c 'echo oops; exit 2'"},
		{[]string{"echo", "it's"}, `echo 'it'\''s'`},
		{[]string{"true", ""}, "true ''"},
		{[]string{"ls", "/tmp/a-b_c.txt", "x=1,y@2"}, "ls /tmp/a-b_c.txt x=1,y@2"},
	} {
		if got := Join(tc.argv); got != tc.want {
			t.Errorf("Join(%q) = %s, want %s", tc.argv, got, tc.want)
		}
	}
}
