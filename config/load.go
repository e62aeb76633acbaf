package config

import (
	"errors"
	"fmt"
	"io/fs"
	"reflect"
	"sort"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/maps"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/providers/posflag"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"
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
// < flags, key by key. An unknown key in the file, an unknown WORKMESH_*
// variable or a value of the wrong type is an error naming it (wrapping
// ErrUnknownSetting or ErrBadValue); a missing file wraps fs.ErrNotExist;
// settings out of bounds wrap ErrInvalid. All problems of one stage are
// reported together.
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

	sources := map[string]Source{}
	var problems []error
	add := func(src Source, m map[string]any, errs []error) error {
		problems = append(problems, errs...)
		if len(m) == 0 {
			return nil
		}
		flat, _ := maps.Flatten(m, nil, ".")
		for key := range flat {
			sources[key] = src
		}
		return k.Load(layer(m), nil)
	}
	if opts.File != "" {
		m, errs := readFile(s, opts.File)
		if err := add(SourceFile, m, errs); err != nil {
			return Config{}, nil, err
		}
	}
	if opts.Environ != nil {
		m, errs := readEnv(s, opts.Environ)
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
	if len(problems) > 0 {
		return Config{}, nil, report("config", "", problems)
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
	if err := c.Validate(); err != nil {
		return Config{}, nil, report("invalid config", "invalid config: ", leaves(err))
	}
	return c, sources, nil
}

// readFile reads the YAML file at path and checks every key and value.
func readFile(s *schema, path string) (map[string]any, []error) {
	kf := koanf.New(".")
	if err := kf.Load(file.Provider(path), yaml.Parser()); err != nil {
		// The path is already in the message; keep only the cause.
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, []error{fmt.Errorf("config %s: %w", path, err)}
	}
	var errs []error
	m := s.normalize("", reflect.TypeFor[Config](), kf.Raw(), func(err error) {
		errs = append(errs, fmt.Errorf("config %s: %w", path, err))
	})
	return m, errs
}

// normalize checks raw, the nested map one source gave for struct type t:
// every key must name a field and every value must have its type. It
// returns the map with values in their canonical types and reports each
// problem to fail.
func (s *schema) normalize(prefix string, t reflect.Type, raw map[string]any, fail func(error)) map[string]any {
	fields := map[string]field{}
	for _, f := range s.fields[t] {
		fields[f.name] = f
	}
	out := map[string]any{}
	for _, name := range sortedNames(raw) {
		v, key := raw[name], prefix+name
		f, ok := fields[name]
		if !ok {
			fail(&problem{msg: fmt.Sprintf("unknown key %q", key), class: ErrUnknownSetting})
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

func badValue(key string, err error) error {
	return &problem{msg: fmt.Sprintf("key %q: %v", key, err), class: ErrBadValue}
}

// readEnv reads the WORKMESH_* variables of environ.
func readEnv(s *schema, environ []string) (map[string]any, []error) {
	var errs []error
	p := env.Provider(".", env.Opt{
		Prefix:      envPrefix,
		EnvironFunc: func() []string { return environ },
		TransformFunc: func(name, value string) (string, any) {
			st := s.byEnv[name]
			if st == nil {
				if !otherEnv[name] {
					errs = append(errs, &problem{
						msg:   fmt.Sprintf("environment variable %s is not a workmesh setting", name),
						class: ErrUnknownSetting,
					})
				}
				return "", nil
			}
			v, err := parseText(st.kind, value)
			if err != nil {
				errs = append(errs, &problem{msg: fmt.Sprintf("environment variable %s: %v", name, err), class: ErrBadValue})
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
			errs = append(errs, &problem{msg: fmt.Sprintf("flag --%s: %v", f.Name, err), class: ErrBadValue})
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

// report joins problems for the user: one reads on one line after
// single, several are listed under a heading that counts them.
func report(heading, single string, problems []error) error {
	if len(problems) == 1 {
		return fmt.Errorf("%s%w", single, problems[0])
	}
	return fmt.Errorf("%s (%d problems):\n%w", heading, len(problems), errors.Join(problems...))
}

// leaves flattens a tree of joined errors into its single errors.
func leaves(err error) []error {
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
