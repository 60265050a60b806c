/* A shared object that is not a Lynx plug-in: it exports no
 * lynx_app_entry. */
__attribute__((visibility("default"))) int not_a_plugin(int x);
int not_a_plugin(int x) { return x + 1; }
