package lvs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestParseSyntax: keepalived's layouts of blocks, comments, quotes and
// includes give the same tree.
func TestParseSyntax(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "conf.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{
		"main.conf": `# comment
! another
virtual_server 192.0.2.1 80 {   # trailing comment
    real_server 10.0.0.1 80
    {
        MISC_CHECK { misc_path "/bin/check a b" }
    }
}
include conf.d/*.conf
`,
		"conf.d/b.conf": "virtual_server 192.0.2.3 80 { protocol TCP }\n",
		"conf.d/a.conf": "virtual_server 192.0.2.2 80 {\n}\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	nodes, err := ParseKeepalivedFile(filepath.Join(dir, "main.conf"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	var walk func(ns []*Node, depth int)
	walk = func(ns []*Node, depth int) {
		for _, n := range ns {
			got = append(got, strings.Repeat(".", depth)+n.Key+" "+strings.Join(n.Args, "|")+" @"+filepath.Base(n.File))
			walk(n.Children, depth+1)
		}
	}
	walk(nodes, 0)
	want := []string{
		"virtual_server 192.0.2.1|80 @main.conf",
		".real_server 10.0.0.1|80 @main.conf",
		"..MISC_CHECK  @main.conf",
		"...misc_path /bin/check a b @main.conf",
		"virtual_server 192.0.2.2|80 @a.conf",
		"virtual_server 192.0.2.3|80 @b.conf",
		".protocol TCP @b.conf",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("tree:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
