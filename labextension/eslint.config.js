// ESLint for the extension: the rules of JupyterLab's extension template, in ESLint's flat
// config. Formatting is prettier's job (`jlpm prettier:check`); eslint-config-prettier turns
// off every rule that would disagree with it.
const js = require('@eslint/js');
const tseslint = require('typescript-eslint');
const prettier = require('eslint-config-prettier');

module.exports = tseslint.config(
  {
    ignores: [
      'node_modules/',
      'lib/',
      'lib-test/',
      '.yarn/',
      '**/*.d.ts',
      'eslint.config.js',
      'style/'
    ]
  },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  prettier,
  {
    files: ['src/**/*.ts', 'src/**/*.tsx'],
    rules: {
      '@typescript-eslint/naming-convention': [
        'error',
        {
          selector: 'interface',
          format: ['PascalCase'],
          custom: { regex: '^I[A-Z]', match: true }
        }
      ],
      '@typescript-eslint/no-unused-vars': ['warn', { args: 'none' }],
      '@typescript-eslint/no-explicit-any': 'off',
      '@typescript-eslint/no-namespace': 'off',
      '@typescript-eslint/no-use-before-define': 'off',
      curly: ['error', 'all'],
      // 'smart': `x == null` stays allowed, the one idiom that means null or undefined
      eqeqeq: ['error', 'smart'],
      'prefer-arrow-callback': 'error'
    }
  },
  {
    // Beyond the template, for the extension's code (not its node:test files, whose
    // test()/describe() promises the runner awaits): a promise nobody awaits or catches is an
    // unhandled rejection in the browser, a failure nobody sees.
    files: ['src/*.ts'],
    languageOptions: {
      parserOptions: { project: 'tsconfig.json', tsconfigRootDir: __dirname }
    },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-misused-promises': 'error',
      '@typescript-eslint/await-thenable': 'error'
    }
  }
);
