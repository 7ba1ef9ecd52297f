package main

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/useshards/shard/client"
)

func TestFormatData(t *testing.T) {
	for _, tc := range []struct {
		name, data, want string
	}{
		{"none", ``, ``},
		{"null", `null`, ``},
		{"not an object", `[1,2]`, `[1,2]`},
		{"exec started",
			`{"user":"root","argv":["pip","install","requests==2.31.0"],"exec":"e1","cwd":"/","env_names":["A","B"],"tty":false,"stdin":true}`,
			`exec=e1 argv="pip install requests==2.31.0" cwd=/ user=root env_names=A,B stdin=true`},
		{"argv needing shell quotes",
			`{"argv":["sh","-c","echo 'hi there'"]}`,
			`argv="sh -c 'echo '\\''hi there'\\'''"`},
		{"exec finished, non-zero",
			`{"exec":"e1","exit_code":1,"signal":0,"timed_out":false,"oom_killed":false,"duration_ms":1250}`,
			`exec=e1 exit_code=1 duration_ms=1250`},
		{"exec finished by a signal",
			`{"exec":"e2","exit_code":137,"signal":9,"timed_out":true}`,
			`exec=e2 exit_code=137 signal=9 timed_out=true`},
		{"exec lost", `{"exec":"e3","error":"connection to the sandbox lost"}`,
			`exec=e3 error="connection to the sandbox lost"`},
		{"checkpoint", `{"tag":"","checkpoint":"ck1","freeze_ms":240,"kind":"checkpoint"}`,
			`checkpoint=ck1 kind=checkpoint freeze_ms=240`},
		{"created",
			`{"image":"python:3.12-slim","digest":"sha256:6a6c0b1e0c9d5f1f0a3e8c2b4d7e9f1a","provider":"gvisor","memory_bytes":536870912,"cpu_millis":1000,"disk_bytes":10737418240}`,
			`image=python:3.12-slim digest=sha256:6a6c0b1e0c9d provider=gvisor memory_bytes=512MiB cpu_millis=1000 disk_bytes=10GiB`},
		{"unknown keys sorted after known ones", `{"zeta":"z","alpha":{"x":1},"reason":"reconcile"}`,
			`reason=reconcile alpha={"x":1} zeta=z`},
		{"odd strings quoted", `{"tag":"a b","name":"tab\there"}`, `tag="a b" name="tab\there"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := formatData(json.RawMessage(tc.data)); got != tc.want {
				t.Errorf("formatData(%s)\n got %s\nwant %s", tc.data, got, tc.want)
			}
		})
	}
}

func TestFormatEvent(t *testing.T) {
	at := time.Date(2026, 11, 29, 12, 0, 1, 500e6, time.UTC)
	for _, tc := range []struct {
		ev   client.Event
		want string
	}{
		{client.Event{Seq: 3, Type: "sandbox.stopped", At: at},
			"3     2026-11-29 12:00:01.500  sandbox.stopped"},
		{client.Event{Seq: 12, Type: "sandbox.exec_finished", At: at, Data: json.RawMessage(`{"exec":"e1","exit_code":0}`)},
			"12    2026-11-29 12:00:01.500  sandbox.exec_finished       exec=e1 exit_code=0"},
	} {
		if got := formatEvent(tc.ev, time.UTC); got != tc.want {
			t.Errorf("formatEvent(%d)\n got %q\nwant %q", tc.ev.Seq, got, tc.want)
		}
	}
}

func TestEventPrinterJSON(t *testing.T) {
	var buf bytes.Buffer
	emit := eventPrinter(&buf, true, time.UTC)
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	emit(client.Event{Seq: 1, Session: "s", Type: "sandbox.created", SandboxID: "3f9a1c2b7d4e", At: at, Data: json.RawMessage(`{"argv":["sh","-c","a > b"]}`)})
	emit(client.Event{Seq: 2, Session: "s", Type: "sandbox.started", SandboxID: "3f9a1c2b7d4e", At: at})
	want := `{"seq":1,"session":"s","type":"sandbox.created","sandbox_id":"3f9a1c2b7d4e","at":"2026-11-29T12:00:00Z","data":{"argv":["sh","-c","a > b"]}}` + "\n" +
		`{"seq":2,"session":"s","type":"sandbox.started","sandbox_id":"3f9a1c2b7d4e","at":"2026-11-29T12:00:00Z"}` + "\n"
	if got := buf.String(); got != want {
		t.Errorf("NDJSON:\n got %s\nwant %s", got, want)
	}
}
