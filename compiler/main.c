/* main.c — the kiln command-line driver (placeholder while the CLI is written). */
#include <stdio.h>
int main(void) { fprintf(stderr, "kiln: not built yet\n"); return 1; }
