package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// docs/api-reference.md is openapi.json rendered as markdown.
// TestAPIReferenceIsCurrent keeps the checked-in file equal to the
// rendering, so the reference cannot drift from the document the server
// serves. The renderer lives here because only the test runs it.

const (
	apiRefFile  = "../../docs/api-reference.md"
	apiRefRegen = "SHARD_UPDATE_DOCS=1 go test ./internal/api -run TestAPIReferenceIsCurrent"
)

func TestAPIReferenceIsCurrent(t *testing.T) {
	got, err := renderAPIReference(OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("SHARD_UPDATE_DOCS") == "1" {
		if err := os.WriteFile(apiRefFile, got, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote docs/api-reference.md (%d bytes)", len(got))
		return
	}
	want, err := os.ReadFile(apiRefFile)
	if err != nil {
		t.Fatalf("%v; generate it with: %s", err, apiRefRegen)
	}
	if !bytes.Equal(got, want) {
		n, g, w := firstDiff(got, want)
		t.Fatalf("docs/api-reference.md is not the rendering of internal/api/openapi.json (line %d is\n  %q\nand should be\n  %q)\nregenerate it, do not edit it: %s", n, w, g, apiRefRegen)
	}
}

// firstDiff returns the first line (1-based) where a and b differ, and
// that line of each.
func firstDiff(a, b []byte) (int, string, string) {
	al, bl := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := 0; ; i++ {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y || i >= len(al) || i >= len(bl) {
			return i + 1, x, y
		}
	}
}

// TestAPIReferenceShape checks what the rendering promises its readers and
// docs/'s own tests: every operation and schema has a section, every
// in-page link leads to a heading, and the only fenced blocks are json and
// text (TestDocCommands runs every sh block of docs/).
func TestAPIReferenceShape(t *testing.T) {
	out, err := renderAPIReference(OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	doc := loadOpenAPI(t)
	titles, anchors := map[string]bool{}, map[string]bool{}
	slugs := newSlugger()
	fenced := false
	for i, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "```") {
			if lang := strings.TrimPrefix(line, "```"); !fenced && lang != "json" && lang != "text" {
				t.Errorf("line %d: a fenced block %q: the reference has only json and text blocks", i+1, line)
			}
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		if h, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " "); ok && strings.HasPrefix(line, "#") {
			titles[h] = true
			anchors["#"+slugs.slug(h)] = true
		}
	}
	if fenced {
		t.Error("a fenced block is not closed")
	}
	for _, m := range regexp.MustCompile(`\]\((#[^)]*)\)`).FindAllStringSubmatch(string(out), -1) {
		if !anchors[m[1]] {
			t.Errorf("a link to %s leads to no heading", m[1])
		}
	}
	paths, _ := doc["paths"].(map[string]any)
	for path, v := range paths {
		item, _ := v.(map[string]any)
		for _, m := range httpMethods {
			if _, ok := item[m]; ok && !titles[strings.ToUpper(m)+" "+path] {
				t.Errorf("no section for %s %s", strings.ToUpper(m), path)
			}
		}
	}
	schemas, _ := resolvePointer(doc, "/components/schemas")
	for name := range schemas.(map[string]any) {
		if !titles[name] {
			t.Errorf("no section for the schema %s", name)
		}
	}
}

func TestAPIReferenceText(t *testing.T) {
	for _, tc := range []struct{ what, got, want string }{
		{"cell pipe", tableCell("a | b"), `a \| b`},
		{"cell newlines", tableCell("one.\n\ntwo\r\nthree"), "one.<br><br>two<br>three"},
		{"code", codeSpan("x"), "`x`"},
		{"code with a backtick", codeSpan("a`b"), "``a`b``"},
		{"code starting with a backtick", codeSpan("`a"), "`` `a ``"},
		{"code of nothing", codeSpan(""), "` `"},
		{"slug", newSlugger().slug("GET /v0/sandboxes/{id}/files"), "get-v0sandboxesidfiles"},
		{"slug of a name", newSlugger().slug("ExecRequest"), "execrequest"},
		{"value string", valueText("py"), "`py`"},
		{"value empty", valueText(""), "`\"\"`"},
		{"value number", valueText(json.Number("0.5")), "`0.5`"},
		{"value list", valueText([]any{"a", json.Number("1")}), "`[\"a\",1]`"},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.what, tc.got, tc.want)
		}
	}
	s := newSlugger()
	if a, b := s.slug("policy"), s.slug("Policy"); a != "policy" || b != "policy-1" {
		t.Errorf("a repeated heading's anchors: %q, %q; want policy, policy-1 (as GitHub numbers them)", a, b)
	}
}

func TestAPIReferenceTypes(t *testing.T) {
	r := &refRenderer{anchors: map[string]string{"schema Sandbox": "sandbox", "schema Env": "env"}}
	for _, tc := range []struct{ schema, want string }{
		{`{"type": "string"}`, "`string`"},
		{`{"type": "string", "format": "date-time"}`, "`string` (date-time)"},
		{`{"type": "string", "enum": ["a", "b"]}`, "`string`, one of: `a`, `b`"},
		{`{"$ref": "#/components/schemas/Sandbox"}`, "[Sandbox](#sandbox)"},
		{`{"allOf": [{"$ref": "#/components/schemas/Env"}], "description": "x"}`, "[Env](#env)"},
		{`{"type": "array", "items": {"type": "integer", "format": "int64"}}`, "`[]integer` (int64)"},
		{`{"type": "array", "items": {"type": "string", "enum": ["x"]}}`, "`[]string`, one of: `x`"},
		{`{"type": "array", "items": {"$ref": "#/components/schemas/Sandbox"}}`, `\[\][Sandbox](#sandbox)`},
		{`{"oneOf": [{"type": "string"}, {"type": "integer"}]}`, "`string` or `integer`"},
		{`{"type": "array", "items": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}`, "\\[\\](`string` or `integer`)"},
		{`{"type": "object", "additionalProperties": {"type": "string"}}`, "`map[string]string`"},
		{`{"type": "object", "additionalProperties": {"$ref": "#/components/schemas/Sandbox"}}`, "map of [Sandbox](#sandbox)"},
		{`{"type": "object", "additionalProperties": true}`, "`object`"},
		{`{"description": "anything"}`, "any"},
	} {
		v, err := decodeOrdered([]byte(tc.schema))
		if err != nil {
			t.Fatal(err)
		}
		if got := r.typeText(v.(*jsonObj)); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.schema, got, tc.want)
		}
	}
}

// object is a JSON object that keeps its keys in the document's order, so
// that the reference lists paths, fields and examples as openapi.json
// writes them rather than sorted.
type jsonObj struct {
	keys []string
	vals map[string]any
}

func (o *jsonObj) get(k string) any {
	if o == nil {
		return nil
	}
	return o.vals[k]
}

// lookup is o's value for k, and whether o has k.
func (o *jsonObj) lookup(k string) (any, bool) {
	if o == nil {
		return nil, false
	}
	v, ok := o.vals[k]
	return v, ok
}

// names is o's keys in the document's order.
func (o *jsonObj) names() []string {
	if o == nil {
		return nil
	}
	return o.keys
}

func (o *jsonObj) obj(k string) *jsonObj { v, _ := o.get(k).(*jsonObj); return v }
func (o *jsonObj) str(k string) string   { v, _ := o.get(k).(string); return v }
func (o *jsonObj) list(k string) []any   { v, _ := o.get(k).([]any); return v }

// decodeOrdered decodes JSON with its objects as *jsonObj and its numbers
// as json.Number (an example's numbers are shown as written).
func decodeOrdered(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeValue(dec)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("more after the first JSON value")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch tok {
	case json.Delim('{'):
		o := &jsonObj{vals: map[string]any{}}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return nil, err
			}
			v, err := decodeValue(dec)
			if err != nil {
				return nil, err
			}
			key := k.(string)
			if _, dup := o.vals[key]; !dup {
				o.keys = append(o.keys, key)
			}
			o.vals[key] = v
		}
		_, err := dec.Token()
		return o, err
	case json.Delim('['):
		a := []any{}
		for dec.More() {
			v, err := decodeValue(dec)
			if err != nil {
				return nil, err
			}
			a = append(a, v)
		}
		_, err := dec.Token()
		return a, err
	}
	return tok, nil
}

// writeIndentedJSON writes v indented by two spaces, keys in their order, and
// without escaping <, > and & (an example shows `Bearer <key>` as is).
func writeIndentedJSON(b *strings.Builder, v any, indent string) {
	switch v := v.(type) {
	case *jsonObj:
		if len(v.keys) == 0 {
			b.WriteString("{}")
			return
		}
		b.WriteString("{\n")
		for i, k := range v.keys {
			b.WriteString(indent + "  " + jsonString(k) + ": ")
			writeIndentedJSON(b, v.vals[k], indent+"  ")
			if i < len(v.keys)-1 {
				b.WriteByte(',')
			}
			b.WriteByte('\n')
		}
		b.WriteString(indent + "}")
	case []any:
		if len(v) == 0 {
			b.WriteString("[]")
			return
		}
		b.WriteString("[\n")
		for i, e := range v {
			b.WriteString(indent + "  ")
			writeIndentedJSON(b, e, indent+"  ")
			if i < len(v)-1 {
				b.WriteByte(',')
			}
			b.WriteByte('\n')
		}
		b.WriteString(indent + "]")
	case string:
		b.WriteString(jsonString(v))
	case json.Number:
		b.WriteString(v.String())
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case nil:
		b.WriteString("null")
	default:
		panic(fmt.Sprintf("writeIndentedJSON: %T", v))
	}
}

func jsonString(s string) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		panic(err) // a string always encodes
	}
	return strings.TrimSuffix(buf.String(), "\n")
}

// compactJSON is v on one line.
func compactJSON(v any) string {
	var b strings.Builder
	writeIndentedJSON(&b, v, "")
	var out bytes.Buffer
	if err := json.Compact(&out, []byte(b.String())); err != nil {
		panic(err) // writeIndentedJSON writes valid JSON
	}
	return out.String()
}

// valueText is a value (an enum's, a default, an example) as a code span:
// a string as it is, anything else as JSON.
func valueText(v any) string {
	if s, ok := v.(string); ok && s != "" {
		return codeSpan(s)
	}
	return codeSpan(compactJSON(v))
}

// code is s as a code span, fenced by more backticks than s holds in a row.
func codeSpan(s string) string {
	longest, run := 0, 0
	for _, r := range s {
		if r == '`' {
			run++
			longest = max(longest, run)
		} else {
			run = 0
		}
	}
	fence := strings.Repeat("`", longest+1)
	if s == "" {
		return "` `"
	}
	if strings.HasPrefix(s, "`") || strings.HasSuffix(s, "`") {
		s = " " + s + " "
	}
	return fence + s + fence
}

// cell makes markdown fit in one table cell: a | would end it and a
// newline the row.
func tableCell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	s = strings.ReplaceAll(s, "\r\n", "\n")
	return strings.ReplaceAll(s, "\n", "<br>")
}

// slugger gives headings the anchors GitHub gives them: lower case,
// punctuation but - and _ dropped, spaces as -, and a repeated anchor
// numbered (-1, -2...) in the order of the headings.
type slugger struct{ seen map[string]bool }

func newSlugger() *slugger { return &slugger{seen: map[string]bool{}} }

func (s *slugger) slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-', unicode.In(r, unicode.L, unicode.M, unicode.N, unicode.Pc):
			b.WriteRune(r)
		}
	}
	base, out := b.String(), b.String()
	for n := 1; s.seen[out]; n++ {
		out = base + "-" + strconv.Itoa(n)
	}
	s.seen[out] = true
	return out
}

// operation is one METHOD of one path.
type refOperation struct {
	method, path string
	op           *jsonObj
	pathParams   []any // the path item's parameters, which every operation of it takes
}

func (o refOperation) title() string { return strings.ToUpper(o.method) + " " + o.path }

// refTagGroup is the operations of one tag, in the document's order.
type refTagGroup struct {
	name, description string
	ops               []refOperation
}

// refRenderer renders one OpenAPI document; anchors maps "op METHOD /path",
// "tag NAME" and "schema NAME" to the anchor of their heading.
type refRenderer struct {
	doc     *jsonObj
	anchors map[string]string
	b       strings.Builder
}

var refMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// renderAPIReference renders an OpenAPI 3 document as the markdown of
// docs/api-reference.md.
func renderAPIReference(data []byte) ([]byte, error) {
	v, err := decodeOrdered(data)
	if err != nil {
		return nil, fmt.Errorf("openapi.json: %w", err)
	}
	doc, ok := v.(*jsonObj)
	if !ok {
		return nil, fmt.Errorf("openapi.json is not an object")
	}
	r := &refRenderer{doc: doc, anchors: map[string]string{}}
	groups := r.groups()
	schemas := doc.obj("components").obj("schemas")
	info := doc.obj("info")
	title := info.str("title") + " reference"

	// Anchors first, in the order of the headings, so that a link can
	// come before what it leads to and repeated names get GitHub's numbers.
	s := newSlugger()
	s.slug(title)
	s.slug("Contents")
	for _, g := range groups {
		r.anchors["tag "+g.name] = s.slug(g.name)
		for _, o := range g.ops {
			r.anchors["op "+o.title()] = s.slug(o.title())
		}
	}
	r.anchors["schemas"] = s.slug("Schemas")
	for _, name := range schemas.names() {
		r.anchors["schema "+name] = s.slug(name)
	}

	nops := 0
	for _, g := range groups {
		nops += len(g.ops)
	}
	r.line("# " + title)
	r.line("")
	r.line(fmt.Sprintf("Every operation of the %s (%s) and every schema it uses: %d operations on %d paths, %d schemas. "+
		"This page is rendered from the API's OpenAPI %s document, [internal/api/openapi.json](../internal/api/openapi.json), "+
		"which the server also serves at `GET /v0/openapi.json`; [The API](api.md) explains keys, errors and limits, with curl examples. "+
		"Do not edit this page: change openapi.json and run `%s`.",
		info.str("title"), info.str("version"), nops, len(doc.obj("paths").names()), len(schemas.names()), doc.str("openapi"), apiRefRegen))
	r.line("")
	r.line("## Contents")
	r.line("")
	for _, g := range groups {
		r.line(fmt.Sprintf("- [%s](#%s)", g.name, r.anchors["tag "+g.name]))
		for _, o := range g.ops {
			r.line(fmt.Sprintf("  - [%s](#%s): %s", o.title(), r.anchors["op "+o.title()], o.op.str("summary")))
		}
	}
	r.line(fmt.Sprintf("- [Schemas](#%s)", r.anchors["schemas"]))
	r.line("")
	for _, g := range groups {
		r.line("## " + g.name)
		r.line("")
		if g.description != "" {
			r.line(g.description)
			r.line("")
		}
		for _, o := range g.ops {
			r.operation(o)
		}
	}
	r.line("## Schemas")
	r.line("")
	for _, name := range schemas.names() {
		r.schema(name, schemas.obj(name))
	}
	return []byte(strings.TrimRight(r.b.String(), "\n") + "\n"), nil
}

func (r *refRenderer) line(s string) { r.b.WriteString(s + "\n") }

// groups sorts the operations by their first tag, in the order of the
// document's tags (then tags it does not list, as they come); each
// operation is in one group, once.
func (r *refRenderer) groups() []refTagGroup {
	var groups []refTagGroup
	at := map[string]int{}
	add := func(name, desc string) int {
		if i, ok := at[name]; ok {
			return i
		}
		at[name] = len(groups)
		groups = append(groups, refTagGroup{name: name, description: desc})
		return at[name]
	}
	for _, t := range r.doc.list("tags") {
		t, _ := t.(*jsonObj)
		add(t.str("name"), t.str("description"))
	}
	paths := r.doc.obj("paths")
	for _, p := range paths.names() {
		item := paths.obj(p)
		for _, m := range item.names() {
			if !slices.Contains(refMethods, m) {
				continue
			}
			op := item.obj(m)
			tag := "other"
			if tags := op.list("tags"); len(tags) > 0 {
				tag, _ = tags[0].(string)
			}
			i := add(tag, "")
			groups[i].ops = append(groups[i].ops, refOperation{method: m, path: p, op: op, pathParams: item.list("parameters")})
		}
	}
	return slices.DeleteFunc(groups, func(g refTagGroup) bool { return len(g.ops) == 0 })
}

// resolve follows a local $ref ("#/components/schemas/Sandbox").
func (r *refRenderer) resolve(ref string) *jsonObj {
	var cur any = r.doc
	for _, tok := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		cur = cur.(*jsonObj).get(tok)
	}
	o, _ := cur.(*jsonObj)
	return o
}

// deref is o, or what it refers to when it is a $ref.
func (r *refRenderer) deref(o *jsonObj) *jsonObj {
	if ref := o.str("$ref"); ref != "" {
		return r.resolve(ref)
	}
	return o
}

func refName(ref string) string { return ref[strings.LastIndex(ref, "/")+1:] }

func (r *refRenderer) schemaLink(ref string) string {
	name := refName(ref)
	return fmt.Sprintf("[%s](#%s)", name, r.anchors["schema "+name])
}

// scopeText says who may call an operation that needs scope.
func scopeText(scope string) string {
	switch scope {
	case "":
		return "none (anyone may call it, with no API key)"
	case "key":
		return "any valid API key, whatever its scopes"
	}
	return codeSpan(scope)
}

func (r *refRenderer) operation(o refOperation) {
	op := o.op
	r.line("### " + o.title())
	r.line("")
	r.line("**" + op.str("summary") + "**")
	r.line("")
	r.line(fmt.Sprintf("Required scope: %s. Operation id: %s.", scopeText(op.str("x-required-scope")), codeSpan(op.str("operationId"))))
	r.line("")
	if d := op.str("description"); d != "" {
		r.line(d)
		r.line("")
	}
	r.parameters(append(slices.Clone(o.pathParams), op.list("parameters")...))
	if body := r.deref(op.obj("requestBody")); body != nil {
		req := "optional"
		if body.get("required") == true {
			req = "required"
		}
		r.line(fmt.Sprintf("**Request body** (%s)", req))
		r.line("")
		if d := body.str("description"); d != "" {
			r.line(d)
			r.line("")
		}
		r.content(body.obj("content"), true)
	}
	r.line("**Responses**")
	r.line("")
	responses := op.obj("responses")
	for _, status := range responses.names() {
		resp := responses.obj(status)
		shared := resp.str("$ref") != ""
		resp = r.deref(resp)
		r.line("**" + status + "**: " + resp.str("description"))
		r.line("")
		headers := resp.obj("headers")
		for _, h := range headers.names() {
			hd := r.deref(headers.obj(h))
			r.line(fmt.Sprintf("Header %s (%s): %s", codeSpan(h), r.typeText(hd.obj("schema")), hd.str("description")))
			r.line("")
		}
		// A shared answer (401, 404...) is the same everywhere: its
		// examples would repeat on every operation, so they are left out.
		r.content(resp.obj("content"), !shared)
	}
}

// parameters renders a parameter table; an operation's parameter replaces
// its path item's of the same name and place.
func (r *refRenderer) parameters(list []any) {
	var params []*jsonObj
	for _, p := range list {
		p := r.deref(p.(*jsonObj))
		i := slices.IndexFunc(params, func(q *jsonObj) bool { return q.str("name") == p.str("name") && q.str("in") == p.str("in") })
		if i >= 0 {
			params[i] = p
		} else {
			params = append(params, p)
		}
	}
	if len(params) == 0 {
		return
	}
	r.line("**Parameters**")
	r.line("")
	r.line("| name | in | required | type | description |")
	r.line("|---|---|---|---|---|")
	for _, p := range params {
		// A parameter has a schema, or content: a media type and its
		// schema (a JSON value in the query).
		typ := r.typeText(p.obj("schema"))
		var notes []string
		if ex, ok := p.lookup("example"); ok {
			notes = append(notes, "Example: "+valueText(ex)+".")
		}
		content := p.obj("content")
		for _, mt := range content.names() {
			typ = codeSpan(mt) + " " + r.typeText(content.obj(mt).obj("schema"))
			if ex, ok := content.obj(mt).lookup("example"); ok {
				notes = append(notes, "Example: "+valueText(ex)+".")
			}
		}
		if exs := p.obj("examples"); exs != nil {
			var vals []string
			for _, k := range exs.names() {
				vals = append(vals, valueText(exs.obj(k).get("value")))
			}
			notes = append(notes, "Examples: "+strings.Join(vals, ", ")+".")
		}
		r.line(fmt.Sprintf("| %s | %s | %s | %s | %s |", codeSpan(p.str("name")), p.str("in"), yesNo(p.get("required") == true),
			tableCell(typ), tableCell(strings.Join(append([]string{p.str("description")}, notes...), " "))))
	}
	r.line("")
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// content renders a body's media types, each with its schema, and, when
// examples is true, its examples.
func (r *refRenderer) content(c *jsonObj, examples bool) {
	for _, mt := range c.names() {
		media := c.obj(mt)
		line := "Body: " + codeSpan(mt)
		if s := media.obj("schema"); s != nil {
			line += ", " + r.typeText(s)
		}
		r.line(line)
		r.line("")
		if !examples {
			continue
		}
		if ex, ok := media.lookup("example"); ok {
			r.example("Example", mt, ex)
		}
		exs := media.obj("examples")
		for _, name := range exs.names() {
			ex := r.deref(exs.obj(name))
			label := "Example " + codeSpan(name)
			if s := ex.str("summary"); s != "" && s != name && !strings.HasPrefix(name, s+"_") {
				label += " (" + s + ")"
			}
			if d := ex.str("description"); d != "" {
				label += ": " + d
			}
			r.example(label, mt, ex.get("value"))
		}
	}
}

// example renders one example value in a fenced block: JSON indented, and
// a string of a media type that is not JSON (a stream's lines, the
// metrics' text) as it is.
func (r *refRenderer) example(label, mediaType string, v any) {
	r.line(label + ":")
	r.line("")
	s, isString := v.(string)
	switch {
	case isString && mediaType != "application/json":
		lang := "text"
		if strings.Contains(mediaType, "json") {
			lang = "json"
		}
		r.line("```" + lang)
		r.line(strings.TrimRight(s, "\n"))
	default:
		var b strings.Builder
		writeIndentedJSON(&b, v, "")
		r.line("```json")
		r.line(b.String())
	}
	r.line("```")
	r.line("")
}

// typeText is a schema's type in a few words of markdown: a $ref as a link
// to its section, an array as []T, a map as map[string]T, a choice as
// "A or B", with its format and enum.
func (r *refRenderer) typeText(s *jsonObj) string {
	if s == nil {
		return "any"
	}
	if ref := s.str("$ref"); ref != "" {
		return r.schemaLink(ref)
	}
	for _, k := range []string{"allOf", "oneOf", "anyOf"} {
		if list := s.list(k); len(list) > 0 {
			var parts []string
			for _, e := range list {
				parts = append(parts, r.typeText(e.(*jsonObj)))
			}
			join := " or "
			if k == "allOf" {
				join = " and "
			}
			return strings.Join(parts, join)
		}
	}
	var out string
	switch t := s.str("type"); t {
	case "":
		return "any"
	case "array":
		out = r.nested("[]", s.obj("items"))
	case "object":
		out = codeSpan("object")
		if ap, ok := s.get("additionalProperties").(*jsonObj); ok {
			out = r.nested("map[string]", ap)
			if !strings.HasPrefix(out, "`") {
				out = "map of " + r.typeText(ap)
			}
		}
	default:
		out = codeSpan(t)
		if f := s.str("format"); f != "" {
			out += " (" + f + ")"
		}
	}
	if enum := s.list("enum"); len(enum) > 0 {
		var vals []string
		for _, e := range enum {
			vals = append(vals, valueText(e))
		}
		out += ", one of: " + strings.Join(vals, ", ")
	}
	return out
}

// nested is a container (prefix "[]" or "map[string]") of elem: in one
// code span with a plain type (`[]string`), else the prefix before elem's
// text.
func (r *refRenderer) nested(prefix string, elem *jsonObj) string {
	inner := r.typeText(elem)
	plain := elem != nil && elem.str("$ref") == "" && elem.get("oneOf") == nil && elem.get("anyOf") == nil && elem.get("allOf") == nil && elem.str("type") != ""
	switch {
	case plain && strings.HasPrefix(inner, "`") && !strings.HasPrefix(inner, "``"):
		return "`" + prefix + inner[1:]
	case strings.Contains(inner, " or ") || strings.Contains(inner, " and "):
		inner = "(" + inner + ")"
	}
	return strings.NewReplacer("[", `\[`, "]", `\]`).Replace(prefix) + inner
}

// schema renders one schema of components/schemas: its description, its
// fields, and its example.
func (r *refRenderer) schema(name string, s *jsonObj) {
	r.line("### " + name)
	r.line("")
	if d := s.str("description"); d != "" {
		r.line(d)
		r.line("")
	}
	props := s.obj("properties")
	if props == nil {
		r.line("Type: " + r.typeText(s) + ".")
		r.line("")
	}
	if len(props.names()) > 0 {
		var required []string
		for _, q := range s.list("required") {
			q, _ := q.(string)
			required = append(required, q)
		}
		r.line("| field | type | required | description |")
		r.line("|---|---|---|---|")
		for _, f := range props.names() {
			p := props.obj(f)
			desc := p.str("description")
			if desc == "" && p.str("$ref") != "" {
				desc = r.resolve(p.str("$ref")).str("description")
			}
			r.line(fmt.Sprintf("| %s | %s | %s | %s |", codeSpan(f), tableCell(r.typeText(p)), yesNo(slices.Contains(required, f)),
				tableCell(strings.Join(append([]string{desc}, fieldNotes(p)...), " "))))
		}
		r.line("")
	}
	if s.get("additionalProperties") == false {
		r.line("Other fields are refused.")
		r.line("")
	}
	if ex, ok := s.lookup("example"); ok {
		r.example("Example", "application/json", ex)
	}
}

// fieldNotes are a field's constraints, default and example, in short
// sentences after its description.
func fieldNotes(p *jsonObj) []string {
	var notes []string
	if v, ok := p.lookup("default"); ok {
		notes = append(notes, "Default: "+valueText(v)+".")
	}
	if v, ok := p.lookup("minimum"); ok {
		if p.get("exclusiveMinimum") == true {
			notes = append(notes, "More than "+compactJSON(v)+".")
		} else {
			notes = append(notes, "Minimum: "+compactJSON(v)+".")
		}
	}
	if v, ok := p.lookup("maximum"); ok {
		notes = append(notes, "Maximum: "+compactJSON(v)+".")
	}
	if v, ok := p.lookup("minItems"); ok {
		if n := compactJSON(v); n == "1" {
			notes = append(notes, "At least one item.")
		} else {
			notes = append(notes, "At least "+n+" items.")
		}
	}
	if v := p.str("pattern"); v != "" {
		notes = append(notes, "Pattern: "+codeSpan(v)+".")
	}
	if v, ok := p.lookup("example"); ok {
		notes = append(notes, "Example: "+valueText(v)+".")
	}
	return notes
}
