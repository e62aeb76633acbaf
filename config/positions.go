package config

import (
	"errors"
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
)

// positions holds where a YAML file set each key, so that a problem with
// a value from the file names its line.
type positions struct {
	path string
	// lines maps the dotted key of every mapping entry to the line of the key.
	lines map[string]int
	// entries maps the key of every block or flow list to its items' lines.
	entries map[string][]int
}

// walk records the lines of the keys of mapping node n and everything
// under it, with prefix before each key. A key set twice in one mapping
// is reported to fail. Aliases are not followed: their keys take the line
// of the key that holds the alias.
func (p *positions) walk(prefix string, n *yaml.Node, fail func(*problem)) {
	switch n.Kind {
	case yaml.MappingNode:
		first := map[string]int{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			key := prefix + k.Value
			if line, ok := first[k.Value]; ok {
				fail(&problem{
					msg:   fmt.Sprintf("key %q is set twice (first on line %d)", key, line),
					class: ErrSyntax,
					keys:  []string{key},
					where: p.at(k.Line),
				})
				continue
			}
			first[k.Value] = k.Line
			p.lines[key] = k.Line
			p.walk(key+".", v, fail)
		}
	case yaml.SequenceNode:
		key := strings.TrimSuffix(prefix, ".")
		for _, item := range n.Content {
			p.entries[key] = append(p.entries[key], item.Line)
		}
	}
}

func (p *positions) at(line int) string {
	return fmt.Sprintf("file %s line %d", p.path, line)
}

// where names the line that set key, or entry (from 1) of it when it is
// a list written one item a line; a key the file does not hold itself
// (order, when the file set only label-balancing.pass-on-error) takes the
// line of its nearest block.
func (p *positions) where(key string, entry int) string {
	if lines := p.entries[key]; entry > 0 && entry <= len(lines) {
		return p.at(lines[entry-1])
	}
	for cand := key; cand != ""; cand = parentKey(cand) {
		if line, ok := p.lines[cand]; ok {
			return p.at(line)
		}
	}
	return "file " + p.path
}

// parentKey returns the key of the block that holds key, "" at the top.
func parentKey(key string) string {
	i := strings.LastIndexByte(key, '.')
	if i < 0 {
		return ""
	}
	return key[:i]
}

// nodeKind names what a YAML node holds, for an error message.
func nodeKind(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("the value %q", n.Value)
	case yaml.AliasNode:
		return "an alias"
	}
	return "a mapping"
}

// locator finds the source of the settings a validation problem is about.
type locator struct {
	schema *schema
	// file holds the positions of the file's keys; nil without a file.
	file *positions
	// sources maps every key a file, the environment or a flag set to
	// the source that set it last.
	sources map[string]Source
}

// locate fills in where the values of each problem came from and returns
// problems. Problems that already say where, or that name no setting, are
// left as they are.
func (l *locator) locate(problems []error) []error {
	for _, e := range problems {
		var p *problem
		if errors.As(e, &p) && p.where == "" && len(p.keys) > 0 {
			p.where = l.where(p)
		}
	}
	return problems
}

// where names the sources of p's settings: the one source when one of them
// was set, else each setting with its source. Defaults are not named.
func (l *locator) where(p *problem) string {
	var keys, wheres []string
	for i, key := range p.keys {
		entry := 0
		if i == 0 {
			entry = p.entry
		}
		if w := l.whereOf(key, entry); w != "" {
			keys, wheres = append(keys, key), append(wheres, w)
		}
	}
	if len(wheres) <= 1 {
		return strings.Join(wheres, "")
	}
	parts := make([]string, len(wheres))
	for i := range wheres {
		parts[i] = keys[i] + " from " + wheres[i]
	}
	return strings.Join(parts, ", ")
}

// whereOf names the source of key's value, "" for a default.
func (l *locator) whereOf(key string, entry int) string {
	src, leaf := l.sourceOf(key)
	switch src {
	case SourceFile:
		if l.file != nil {
			return l.file.where(key, entry)
		}
	case SourceEnv:
		if st := l.schema.byKey[leaf]; st != nil {
			return "env " + st.env
		}
	case SourceFlag:
		if st := l.schema.byKey[leaf]; st != nil {
			return "flag --" + st.flag
		}
	}
	return ""
}

// sourceOf returns the source of key and the key that source set: key
// itself, or for a key that was not set itself (a block, or an entry of
// one such as label-balancing.order when only pass-on-error was set) the
// strongest source of a key beside or under it.
func (l *locator) sourceOf(key string) (Source, string) {
	for cand := key; cand != ""; cand = parentKey(cand) {
		if src, ok := l.sources[cand]; ok {
			return src, cand
		}
		best, bestKey := SourceDefault, ""
		for k, src := range l.sources {
			if strings.HasPrefix(k, cand+".") && (rank(src) > rank(best) || rank(src) == rank(best) && k < bestKey) {
				best, bestKey = src, k
			}
		}
		if bestKey != "" {
			return best, bestKey
		}
	}
	return SourceDefault, ""
}

// rank orders the sources by precedence.
func rank(s Source) int {
	switch s {
	case SourceFile:
		return 1
	case SourceEnv:
		return 2
	case SourceFlag:
		return 3
	}
	return 0
}
