package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/maps"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/posflag"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// LoadOptions says where settings come from. Any field may be zero.
type LoadOptions struct {
	// File is a YAML file to read; empty means none. A file named here
	// must exist.
	File string
	// Flags is a parsed flag set that BindFlags registered on; only the
	// flags the user changed override. Flags it does not know are ignored.
	Flags *pflag.FlagSet
	// Environ is the environment in os.Environ() form; nil means none.
	Environ []string
	// OtherEnv names WORKMESH_* variables that the program reads itself
	// and that are not settings (a client's target address, say): Load
	// neither reads nor refuses them. Every other WORKMESH_* variable that
	// names no setting is an error.
	OtherEnv []string
	// KnownWorkTypes lists every work type the program has; a work type
	// in work-types or work-type-defaults that is not among them is an
	// error naming them all. Nil means work types are not checked.
	KnownWorkTypes []string
	// Membership, when set, checks network-authority and membership-cert
	// with what only the program can read (the key, the certificate file,
	// the node's identity); its findings are reported like every other
	// problem, warnings through Warn.
	Membership MembershipCheck
	// Warn receives each warning, with where its setting came from; nil
	// drops them.
	Warn func(string)
}

// MembershipCheck checks the membership settings of a loaded, valid c.
type MembershipCheck func(c *Config) []Finding

// Finding is a problem or a warning a MembershipCheck found.
type Finding struct {
	// Key is the setting the finding is about.
	Key string
	// Msg says what is wrong and what to do.
	Msg string
	// Warning marks a finding that does not stop the settings loading.
	Warning bool
}

// Source says where the effective value of a setting came from.
type Source string

// The sources of a setting, from lowest to highest precedence.
const (
	SourceDefault Source = "default"
	SourceFile    Source = "file"
	SourceEnv     Source = "env"
	SourceFlag    Source = "flag"
)

// Setting is one effective setting and where its value came from, as
// `workmesh config print` shows it.
type Setting struct {
	// Key is the YAML key, dotted inside blocks: "worker-timeout",
	// "label-balancing.order", "work-type-defaults.sha256.label-balancing.order".
	Key string
	// Value is the effective value in the form the environment takes:
	// "500ms", "full,archive", "true".
	Value string
	// Source is the source that set Value last.
	Source Source
}

// BindFlags registers every flag-settable setting on fs with its default
// value and a one-line help text saying what it bounds. The per-work-type
// work-type-defaults map is file-only and has no flags.
func BindFlags(fs *pflag.FlagSet) {
	s := mustSchema()
	d := Defaults()
	root := reflect.ValueOf(&d)
	for _, st := range s.settings {
		// A setting inside a block that is off by default (label-balancing)
		// shows the default it takes once the block is on.
		v, _ := st.value(root, true)
		def, _ := canonical(st.kind, v)
		usage := help[st.key]
		switch st.kind {
		case kindString:
			x, _ := def.(string)
			fs.String(st.flag, x, usage)
		case kindBool:
			x, _ := def.(bool)
			fs.Bool(st.flag, x, usage)
		case kindInt:
			x, _ := def.(int)
			fs.Int(st.flag, x, usage)
		case kindFloat:
			x, _ := def.(float64)
			fs.Float64(st.flag, x, usage)
		case kindDuration:
			x, _ := def.(time.Duration)
			fs.Duration(st.flag, x, usage)
		case kindStrings:
			x, _ := def.([]string)
			fs.StringSlice(st.flag, x, usage)
		}
	}
}

// Load returns the effective, defaulted and validated Config.
//
// Sources apply in the order defaults < YAML file < WORKMESH_* environment
// < flags, key by key. Every problem is reported, each naming the setting,
// its value, what is wanted and where the value came from ("file
// node.yaml line 12", "env WORKMESH_MAX_RETRIES", "flag --max-retries"):
// an unknown key in the file or an unknown WORKMESH_* variable wraps
// ErrUnknownSetting, a value of the wrong type ErrBadValue, a file that is
// not YAML ErrSyntax, a missing file fs.ErrNotExist, and a setting out of
// bounds ErrInvalid.
func Load(opts LoadOptions) (Config, error) {
	c, _, err := load(opts)
	return c, err
}

// Explain loads like Load and lists every effective setting with the source
// of its value, in declaration order, then work-type-defaults by work type.
// Settings inside a block that is off (label-balancing when unset) are left
// out.
func Explain(opts LoadOptions) ([]Setting, error) {
	c, sources, err := load(opts)
	if err != nil {
		return nil, err
	}
	var out []Setting
	mustSchema().walkLeaves("", reflect.ValueOf(c), func(key string, f field, v reflect.Value) {
		src, ok := sources[key]
		if !ok {
			src = SourceDefault
		}
		out = append(out, Setting{Key: key, Value: format(f.kind, v), Source: src})
	})
	return out, nil
}

// CheckEnviron reports every WORKMESH_* variable of environ that is neither
// a setting nor named in other, with the same error Load gives for it. It
// is for programs that read WORKMESH_* variables without loading settings.
func CheckEnviron(environ []string, other ...string) error {
	s, err := loadSchema()
	if err != nil {
		return err
	}
	var problems []error
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, envPrefix) && s.byEnv[name] == nil && !slices.Contains(other, name) {
			problems = append(problems, s.unknownEnv(name, other))
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return problemList(problems)
}

// load does the work of Load and also returns the source of every key that
// a file, the environment or a flag set.
func load(opts LoadOptions) (Config, map[string]Source, error) {
	s, err := loadSchema()
	if err != nil {
		return Config{}, nil, err
	}
	k := koanf.New(".")
	if err := k.Load(layer(s.toMap(reflect.ValueOf(Defaults()))), nil); err != nil {
		return Config{}, nil, fmt.Errorf("config defaults: %w", err)
	}

	loc := &locator{schema: s, sources: map[string]Source{}}
	var problems []error
	add := func(src Source, m map[string]any, errs []error) error {
		problems = append(problems, errs...)
		if len(m) == 0 {
			return nil
		}
		flat, _ := maps.Flatten(m, nil, ".")
		for key := range flat {
			loc.sources[key] = src
		}
		return k.Load(layer(m), nil)
	}
	// A file that could not be read or parsed leaves its settings unknown;
	// checking the others against the defaults in their place would report
	// problems that are not there.
	fileUsable := true
	if opts.File != "" {
		f, errs := readFile(s, opts.File)
		fileUsable = f.pos != nil
		loc.file = f.pos
		if err := add(SourceFile, f.values, errs); err != nil {
			return Config{}, nil, err
		}
	}
	if opts.Environ != nil {
		m, errs := readEnv(s, opts.Environ, opts.OtherEnv)
		if err := add(SourceEnv, m, errs); err != nil {
			return Config{}, nil, err
		}
	}
	if opts.Flags != nil {
		m, errs := readFlags(s, opts.Flags)
		if err := add(SourceFlag, m, errs); err != nil {
			return Config{}, nil, err
		}
	}
	if !fileUsable {
		return Config{}, nil, problemList(loc.locate(problems))
	}

	// Every value is already checked and canonical, so the decode is
	// strict: an unused key here would mean the schema and the struct
	// disagree, which is a bug.
	var c Config
	err = k.UnmarshalWithConf("", &c, koanf.UnmarshalConf{
		DecoderConfig: &mapstructure.DecoderConfig{TagName: "koanf", ErrorUnused: true},
	})
	if err != nil {
		return Config{}, nil, fmt.Errorf("config: decode: %w", err)
	}
	c.SetDefaults()
	// A value refused above was left at its default; a check of it, or
	// against it, would report a problem the user does not have.
	for _, e := range leaves(c.Validate()) {
		if !overlaps(e, problems) {
			problems = append(problems, e)
		}
	}
	if opts.KnownWorkTypes != nil {
		problems = append(problems, leaves(c.validateWorkTypes(opts.KnownWorkTypes))...)
	}
	if opts.Membership != nil && !overlaps(&problem{keys: []string{"network-authority", "membership-cert", "network", "data-dir"}}, problems) {
		var warnings []error
		for _, f := range opts.Membership(&c) {
			p := &problem{msg: f.Msg, class: ErrInvalid, keys: []string{f.Key}}
			if f.Warning {
				warnings = append(warnings, p)
			} else {
				problems = append(problems, p)
			}
		}
		if opts.Warn != nil {
			for _, w := range loc.locate(warnings) {
				opts.Warn(w.Error())
			}
		}
	}
	if len(problems) > 0 {
		return Config{}, nil, problemList(loc.locate(problems))
	}
	return c, loc.sources, nil
}

// overlaps reports whether e is about a setting that one of refused, the
// problems of the sources, is about: the same key, or one inside the other.
func overlaps(e error, refused []error) bool {
	var p *problem
	if !errors.As(e, &p) {
		return false
	}
	for _, r := range refused {
		var rp *problem
		if !errors.As(r, &rp) {
			continue
		}
		for _, a := range p.keys {
			for _, b := range rp.keys {
				if a == b || strings.HasPrefix(a, b+".") || strings.HasPrefix(b, a+".") {
					return true
				}
			}
		}
	}
	return false
}

// fileSettings is what readFile found in a file: the checked values and
// the positions of their keys. pos is nil when the file could not be read
// or is not a YAML mapping.
type fileSettings struct {
	values map[string]any
	pos    *positions
}

// readFile reads the YAML file at path and checks every key and value.
// koanf's YAML parser keeps no positions, so the file is decoded into a
// yaml.Node first, which gives every key its line.
func readFile(s *schema, path string) (fileSettings, []error) {
	data, err := os.ReadFile(path)
	if err != nil {
		// The path is already in the message; keep only the cause.
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return fileSettings{}, []error{fmt.Errorf("file %s: %w", path, err)}
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fileSettings{}, []error{&problem{msg: fmt.Sprintf("file %s: %v", path, err), class: ErrSyntax}}
	}
	pos := &positions{path: path, lines: map[string]int{}, entries: map[string][]int{}}
	if len(doc.Content) == 0 {
		return fileSettings{pos: pos}, nil // an empty file sets nothing
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return fileSettings{}, []error{&problem{
			msg:   fmt.Sprintf("file %s line %d: want a mapping of settings, got %s", path, root.Line, nodeKind(root)),
			class: ErrSyntax,
		}}
	}
	var errs []error
	pos.walk("", root, func(p *problem) { errs = append(errs, p) })
	if len(errs) > 0 {
		return fileSettings{}, errs
	}
	var raw map[string]any
	if err := root.Decode(&raw); err != nil {
		return fileSettings{}, []error{&problem{msg: fmt.Sprintf("file %s: %v", path, err), class: ErrSyntax}}
	}
	m := s.normalize("", reflect.TypeFor[Config](), raw, func(p *problem) {
		p.where = pos.where(p.keys[0], p.entry)
		errs = append(errs, p)
	})
	return fileSettings{values: m, pos: pos}, errs
}

// normalize checks raw, the nested map one source gave for struct type t:
// every key must name a field and every value must have its type. It
// returns the map with values in their canonical types and reports each
// problem to fail.
func (s *schema) normalize(prefix string, t reflect.Type, raw map[string]any, fail func(*problem)) map[string]any {
	fields := map[string]field{}
	for _, f := range s.fields[t] {
		fields[f.name] = f
	}
	out := map[string]any{}
	for _, name := range sortedNames(raw) {
		v, key := raw[name], prefix+name
		f, ok := fields[name]
		if !ok {
			fail(&problem{
				msg:   fmt.Sprintf("unknown key %q%s", key, didYouMean(key, fieldNames(prefix, fields))),
				class: ErrUnknownSetting,
				keys:  []string{key},
			})
			continue
		}
		switch f.kind {
		case kindBlock:
			if v == nil {
				continue // "label-balancing:" with nothing under it leaves it off
			}
			sub, ok := v.(map[string]any)
			if !ok {
				fail(badValue(key, want("a mapping", v)))
				continue
			}
			out[name] = s.normalize(key+".", f.block(), sub, fail)
		case kindBlockMap:
			if v == nil {
				continue
			}
			sub, ok := v.(map[string]any)
			if !ok {
				fail(badValue(key, want("a mapping from name to settings", v)))
				continue
			}
			m := map[string]any{}
			for _, entry := range sortedNames(sub) {
				ev, entryKey := sub[entry], key+"."+entry
				em, ok := ev.(map[string]any)
				if ev != nil && !ok {
					fail(badValue(entryKey, want("a mapping", ev)))
					continue
				}
				m[entry] = s.normalize(entryKey+".", f.block(), em, fail)
			}
			out[name] = m
		default:
			cv, err := coerce(f.kind, v)
			if err != nil {
				fail(badValue(key, err))
				continue
			}
			out[name] = cv
		}
	}
	return out
}

func badValue(key string, err error) *problem {
	return &problem{msg: fmt.Sprintf("%s: %v", key, err), class: ErrBadValue, keys: []string{key}}
}

// fieldNames returns the keys of fields with prefix before each, sorted.
func fieldNames(prefix string, fields map[string]field) []string {
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, prefix+name)
	}
	sort.Strings(names)
	return names
}

// readEnv reads the WORKMESH_* variables of environ; those named in other
// are left alone.
func readEnv(s *schema, environ, other []string) (map[string]any, []error) {
	var errs []error
	p := env.Provider(".", env.Opt{
		Prefix:      envPrefix,
		EnvironFunc: func() []string { return environ },
		TransformFunc: func(name, value string) (string, any) {
			st := s.byEnv[name]
			if st == nil {
				if !slices.Contains(other, name) {
					errs = append(errs, s.unknownEnv(name, other))
				}
				return "", nil
			}
			v, err := parseText(st.kind, value)
			if err != nil {
				p := badValue(st.key, err)
				p.where = "env " + name
				errs = append(errs, p)
				return "", nil
			}
			return st.key, v
		},
	})
	m, err := p.Read()
	if err != nil {
		errs = append(errs, fmt.Errorf("environment: %w", err))
	}
	return m, errs
}

// unknownEnv is the problem of a WORKMESH_* variable that names no
// setting and is not one of other: it names the variable, the nearest
// known one and how the known ones are named.
func (s *schema) unknownEnv(name string, other []string) error {
	known := make([]string, 0, len(s.byEnv)+len(other))
	for _, st := range s.settings {
		known = append(known, st.env)
	}
	known = append(known, other...)
	hint := didYouMean(name, known)
	if hint == "" {
		hint = ";"
	}
	reads := envPrefix + "<KEY>"
	if len(other) > 0 {
		reads = strings.Join(other, ", ") + " and " + reads
	}
	examples := []string{fmt.Sprintf("%s for max-retries", s.byKey["max-retries"].env)}
	for _, st := range s.settings {
		if st.env != envName(st.key) {
			examples = append(examples, fmt.Sprintf("but %s for %s", st.env, st.key))
		}
	}
	msg := fmt.Sprintf("environment variable %s is not a workmesh variable%s workmesh reads %s for every setting key "+
		"`workmesh config print` lists (%s)", name, hint, reads, strings.Join(examples, ", "))
	return &problem{msg: msg, class: ErrUnknownSetting}
}

// readFlags reads the flags of fs that the user changed.
//
// No koanf instance is passed to posflag: with one, posflag also merges the
// defaults of unchanged flags whose key nothing has set yet, and the
// label-balancing flags would then switch label balancing on.
func readFlags(s *schema, fs *pflag.FlagSet) (map[string]any, []error) {
	var errs []error
	p := posflag.ProviderWithFlag(fs, ".", nil, func(f *pflag.Flag) (string, any) {
		st := s.byFlag[f.Name]
		if st == nil || !f.Changed {
			return "", nil
		}
		v, err := coerce(st.kind, posflag.FlagVal(fs, f))
		if err != nil {
			p := badValue(st.key, err)
			p.where = "flag --" + f.Name
			errs = append(errs, p)
			return "", nil
		}
		return st.key, v
	})
	m, err := p.Read()
	if err != nil {
		errs = append(errs, fmt.Errorf("flags: %w", err))
	}
	return m, errs
}

// layer hands an already checked nested map to koanf.
type layer map[string]any

func (l layer) Read() (map[string]any, error) { return l, nil }
func (l layer) ReadBytes() ([]byte, error) {
	return nil, errors.New("config layer: ReadBytes is not supported")
}

// problemList is every configuration problem found at once. It reads
// "config: <problem>" for one, else a heading that counts them and one
// problem a line, and it unwraps to each, so that errors.Is finds every
// class among them.
type problemList []error

func (l problemList) Error() string {
	if len(l) == 1 {
		return "config: " + l[0].Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "config (%d problems):", len(l))
	for _, p := range l {
		b.WriteString("\n  ")
		b.WriteString(p.Error())
	}
	return b.String()
}

func (l problemList) Unwrap() []error { return l }

// leaves flattens a tree of joined errors into its single errors.
func leaves(err error) []error {
	if err == nil {
		return nil
	}
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return []error{err}
	}
	var out []error
	for _, e := range j.Unwrap() {
		out = append(out, leaves(e)...)
	}
	return out
}

func sortedNames(m map[string]any) []string {
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}
