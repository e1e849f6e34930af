// ESLint for the page's modules (static/js): the recommended rules, browser globals, ES modules.
import js from "@eslint/js";
import globals from "globals";

export default [
  { files: ["static/js/**/*.js"], ...js.configs.recommended },
  {
    files: ["static/js/**/*.js"],
    languageOptions: {
      ecmaVersion: 2022,
      sourceType: "module",
      globals: { ...globals.browser },
    },
    linterOptions: { reportUnusedDisableDirectives: "error" },
  },
];
