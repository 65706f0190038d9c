// keepalived.conf's syntax: a statement is a keyword and its arguments on
// one line, a block opens with "{" (on the line or the next) and closes
// with "}", "#" and "!" start comments, "include" takes a glob relative to
// the including file. The parser knows the syntax, not the keywords'
// meaning (keepalived.go).

package lvs

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Node is one statement: a keyword, its arguments and, for a block, its
// statements.
type Node struct {
	Key      string
	Args     []string
	Children []*Node
	Block    bool
	File     string
	Line     int
}

// Where names the statement's place for errors: "FILE:LINE".
func (n *Node) Where() string { return fmt.Sprintf("%s:%d", n.File, n.Line) }

// maxIncludeDepth bounds nested includes (a file including itself).
const maxIncludeDepth = 8

// ParseFile reads a configuration file and the files it includes.
func ParseKeepalivedFile(path string) ([]*Node, error) {
	return parseFile(path, 0)
}

func parseFile(path string, depth int) ([]*Node, error) {
	if depth > maxIncludeDepth {
		return nil, fmt.Errorf("%s: includes nested more than %d deep", path, maxIncludeDepth)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read keepalived configuration: %w", err)
	}
	defer f.Close()
	return parse(f, path, depth)
}

// Parse reads a configuration from r; name is its file name for errors
// and the directory includes are relative to.
func ParseKeepalived(r io.Reader, name string) ([]*Node, error) { return parse(r, name, 0) }

type token struct {
	text   string
	line   int
	quoted bool
}

func parse(r io.Reader, name string, depth int) ([]*Node, error) {
	lines, err := tokenize(r, name)
	if err != nil {
		return nil, err
	}
	p := &parser{name: name, lines: lines, depth: depth}
	nodes, err := p.block(false)
	if err != nil {
		return nil, err
	}
	return nodes, nil
}

// tokenize splits the input into lines of tokens; braces are tokens of
// their own, comments and empty lines are dropped.
func tokenize(r io.Reader, name string) ([][]token, error) {
	var out [][]token
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		var toks []token
		s := sc.Text()
		for i := 0; i < len(s); {
			c := s[i]
			switch {
			case c == ' ' || c == '\t' || c == '\r':
				i++
			case c == '#' || c == '!':
				i = len(s)
			case c == '{' || c == '}':
				toks = append(toks, token{text: string(c), line: n})
				i++
			case c == '"':
				j := strings.IndexByte(s[i+1:], '"')
				if j < 0 {
					return nil, fmt.Errorf("%s:%d: unterminated quoted string", name, n)
				}
				toks = append(toks, token{text: s[i+1 : i+1+j], line: n, quoted: true})
				i += j + 2
			default:
				j := i
				for j < len(s) && !strings.ContainsRune(" \t\r{}\"", rune(s[j])) {
					j++
				}
				toks = append(toks, token{text: s[i:j], line: n})
				i = j
			}
		}
		if len(toks) > 0 {
			out = append(out, toks)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	return out, nil
}

type parser struct {
	name  string
	lines [][]token
	pos   int // next line
	depth int
}

// block reads statements until the end of input (top) or a closing brace.
func (p *parser) block(inner bool) ([]*Node, error) {
	var out []*Node
	for p.pos < len(p.lines) {
		toks := p.lines[p.pos]
		p.pos++
		for len(toks) > 0 {
			t := toks[0]
			if t.text == "}" && !t.quoted {
				if !inner {
					return nil, fmt.Errorf("%s:%d: \"}\" without a block to close", p.name, t.line)
				}
				if len(toks) > 1 {
					// "} keyword" on one line: the rest is the parent's.
					p.pos--
					p.lines[p.pos] = toks[1:]
				}
				return out, nil
			}
			if t.text == "{" && !t.quoted {
				return nil, fmt.Errorf("%s:%d: \"{\" without a keyword", p.name, t.line)
			}
			n := &Node{Key: t.text, File: p.name, Line: t.line}
			i := 1
			for i < len(toks) && (toks[i].quoted || toks[i].text != "{" && toks[i].text != "}") {
				n.Args = append(n.Args, toks[i].text)
				i++
			}
			rest := toks[i:]
			// A block's brace may stand alone on the next line.
			if len(rest) == 0 && p.pos < len(p.lines) && p.lines[p.pos][0].text == "{" && !p.lines[p.pos][0].quoted {
				rest = p.lines[p.pos]
				p.pos++
			}
			if len(rest) > 0 && rest[0].text == "{" && !rest[0].quoted {
				n.Block = true
				// What follows "{" on its line is the block's first
				// statement.
				if len(rest) > 1 {
					p.pos--
					p.lines[p.pos] = rest[1:]
				}
				kids, err := p.block(true)
				if err != nil {
					return nil, err
				}
				n.Children = kids
				toks = nil
			} else {
				toks = rest
			}
			if n.Key == "include" {
				inc, err := p.include(n)
				if err != nil {
					return nil, err
				}
				out = append(out, inc...)
				continue
			}
			if strings.HasPrefix(n.Key, "@") || strings.HasPrefix(n.Key, "$") {
				return nil, fmt.Errorf("%s: %q: keepalived's conditional configuration and parameter substitution are not read: give the configuration as keepalived expands it", n.Where(), n.Key)
			}
			out = append(out, n)
		}
	}
	if inner {
		return nil, fmt.Errorf("%s: a block is not closed (missing \"}\")", p.name)
	}
	return out, nil
}

// include reads the files an include statement names (a glob relative to
// the including file's directory).
func (p *parser) include(n *Node) ([]*Node, error) {
	if len(n.Args) != 1 || n.Block {
		return nil, fmt.Errorf("%s: include takes one file name or pattern", n.Where())
	}
	pat := n.Args[0]
	if !filepath.IsAbs(pat) {
		pat = filepath.Join(filepath.Dir(p.name), pat)
	}
	files, err := filepath.Glob(pat)
	if err != nil {
		return nil, fmt.Errorf("%s: include %q: %w", n.Where(), n.Args[0], err)
	}
	var out []*Node
	for _, f := range files {
		nodes, err := parseFile(f, p.depth+1)
		if err != nil {
			return nil, err
		}
		out = append(out, nodes...)
	}
	return out, nil
}
